// chunkattn-coordinator's flags into its config (coordinator_config.h): every
// bad value is refused naming its flag before anything starts, and good ones
// reach the engine, the workers' join and the HTTP guard.
#include "services/coordinator/coordinator_config.h"

#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "base/tests/redis_server.h"
#include "base/tests/temp_dir.h"

ABSL_DECLARE_FLAG(std::string, workers);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int, chunk_size);
ABSL_DECLARE_FLAG(int, max_batch_size);
ABSL_DECLARE_FLAG(int, max_tokens_per_step);
ABSL_DECLARE_FLAG(double, tenant_max_batch_share);
ABSL_DECLARE_FLAG(double, step_timeout_s);
ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, kv_events_format);
ABSL_DECLARE_FLAG(bool, kv_events);
ABSL_DECLARE_FLAG(int64_t, http_max_body_bytes);
ABSL_DECLARE_FLAG(std::string, served_model_name);
ABSL_DECLARE_FLAG(int, mask_threads);
ABSL_DECLARE_FLAG(std::string, kv_tier_write_policy);
ABSL_DECLARE_FLAG(std::string, kv_store_url);
ABSL_DECLARE_FLAG(std::string, kv_store_url_file);
ABSL_DECLARE_FLAG(std::string, kv_store_tls_ca_file);
ABSL_DECLARE_FLAG(std::string, kv_store_tls_cert_file);
ABSL_DECLARE_FLAG(std::string, kv_store_tls_key_file);

namespace chunkattn {
namespace {

class CoordinatorConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_workers, "127.0.0.1:50061,127.0.0.1:50062");
    absl::SetFlag(&FLAGS_model, "/models/demo");
  }
  absl::FlagSaver saver_;  // every test starts from the defaults
};

TEST_F(CoordinatorConfigTest, GoodFlagsReachTheEngineAndTheJoin) {
  absl::SetFlag(&FLAGS_chunk_size, 32);
  absl::SetFlag(&FLAGS_max_batch_size, 8);
  absl::SetFlag(&FLAGS_served_model_name, "demo");
  absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.workers.addresses.size(), 2u);
  EXPECT_EQ(c->engine.scheduler.chunk_size, 32);
  EXPECT_EQ(c->engine.workers.join.chunk_size(), 32u);
  EXPECT_EQ(c->engine.workers.join.max_batch_size(), 8u);
  EXPECT_EQ(c->engine.workers.join.model(), "/models/demo");
  EXPECT_EQ(c->engine.model_name, "demo");
  EXPECT_TRUE(c->engine.workers.adaptive_step_timeout);  // -1: from measured steps
  EXPECT_FALSE(c->kv_events.has_value());
  EXPECT_GE(c->engine.mask_threads, 1);  // 0: a quarter of the CPUs, 1 to 8
  EXPECT_LE(c->engine.mask_threads, 8);
  EXPECT_FALSE(c->engine.scheduler.tier_write_through);  // write_back

  ModelConfig model;
  model.max_context = 4096;
  model.eos_token_ids = {2};
  const EngineOptions options = EngineOptionsFor(*c, model, nullptr);
  EXPECT_EQ(options.scheduler.max_context, 4096);
  EXPECT_EQ(options.scheduler.eos_token_ids, std::vector<int32_t>{2});
  absl::StatusOr<http::Options> http = HttpOptionsFor(*c, model.max_context);
  ASSERT_TRUE(http.ok()) << http.status();
  EXPECT_GE(http->max_body_bytes, size_t{1} << 20);  // a whole-context text prompt fits
  EXPECT_GT(http->max_connections, 0);
}

TEST_F(CoordinatorConfigTest, EachBadFlagIsRefusedByName) {
  struct Case {
    std::function<void()> set;
    const char* flag;
  };
  const Case cases[] = {
      {[] { absl::SetFlag(&FLAGS_workers, ""); }, "--workers"},
      {[] { absl::SetFlag(&FLAGS_workers, "127.0.0.1:0x"); }, "--workers"},
      {[] { absl::SetFlag(&FLAGS_model, ""); }, "--model"},
      {[] { absl::SetFlag(&FLAGS_listen, "nowhere"); }, "--listen"},
      {[] { absl::SetFlag(&FLAGS_chunk_size, 48); }, "--chunk_size"},
      {[] { absl::SetFlag(&FLAGS_max_tokens_per_step, 4); }, "--max_tokens_per_step"},
      {[] { absl::SetFlag(&FLAGS_tenant_max_batch_share, 0.0); }, "--tenant_max_batch_share"},
      {[] { absl::SetFlag(&FLAGS_step_timeout_s, -2.0); }, "--step_timeout_s"},
      {[] { absl::SetFlag(&FLAGS_mask_threads, -1); }, "--mask_threads"},
      {[] { absl::SetFlag(&FLAGS_mask_threads, 65); }, "--mask_threads"},
      {[] { absl::SetFlag(&FLAGS_kv_tier_write_policy, "write_around"); }, "--kv_tier_write_policy"},
      {[] { absl::SetFlag(&FLAGS_kv_store_url, "redis://:pw@h:0"); }, "--kv_store_url"},
      {[] { absl::SetFlag(&FLAGS_kv_store_url, "http://h:6379"); }, "--kv_store_url"},
      {[] {
         absl::SetFlag(&FLAGS_kv_events, true);
         absl::SetFlag(&FLAGS_kv_events_format, "xml");
       },
       "--kv_events_format"},
  };
  for (const Case& c : cases) {
    absl::FlagSaver restore;
    c.set();
    absl::StatusOr<CoordinatorConfig> config = CoordinatorConfigFromFlags();
    ASSERT_FALSE(config.ok()) << c.flag;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
    EXPECT_TRUE(absl::StrContains(config.status().message(), c.flag)) << config.status();
  }
}

TEST_F(CoordinatorConfigTest, KvStoreUrlGoesToTheWorkersJoin) {
  {
    absl::FlagSaver restore;
    absl::SetFlag(&FLAGS_kv_store_url, "redis://:s3cret@redis.kv:6379/1");
    absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->engine.kv_store_url, "redis://:s3cret@redis.kv:6379/1");
    EXPECT_EQ(c->engine.workers.join.kv_store_url(), "redis://:s3cret@redis.kv:6379/1");
  }
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_kv_store_url, "redis://:s3cret@redis.kv:port");
  absl::StatusOr<CoordinatorConfig> bad = CoordinatorConfigFromFlags();
  ASSERT_FALSE(bad.ok());
  EXPECT_FALSE(absl::StrContains(bad.status().message(), "s3cret")) << bad.status();
  absl::StatusOr<CoordinatorConfig> off = [] {
    absl::FlagSaver inner;
    absl::SetFlag(&FLAGS_kv_store_url, "");
    return CoordinatorConfigFromFlags();
  }();
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(off->engine.workers.join.kv_store_url().empty());
}

// rediss://: the CA, certificate and key files' PEM go to the Join (the
// workers need no copy), checked first; the key file is read as a secret;
// TLS flags without a rediss:// URL, or PEM that does not parse, are refused
// without quoting the key.
TEST_F(CoordinatorConfigTest, KvStoreTlsFilesGoToTheWorkersJoin) {
  RedisTlsFilesForTest files;
  ASSERT_TRUE(files.Make()) << "openssl (scripts/install-deps.sh installs it)";
  ASSERT_EQ(::chmod(files.Path("client.key").c_str(), 0600), 0);
  auto set_files = [&] {
    absl::SetFlag(&FLAGS_kv_store_tls_ca_file, files.Path("ca.crt"));
    absl::SetFlag(&FLAGS_kv_store_tls_cert_file, files.Path("client.crt"));
    absl::SetFlag(&FLAGS_kv_store_tls_key_file, files.Path("client.key"));
  };
  {
    absl::FlagSaver restore;
    absl::SetFlag(&FLAGS_kv_store_url, "rediss://:s3cret@redis.kv:6380");
    set_files();
    absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->engine.workers.join.kv_store_tls_ca_pem(), files.Read("ca.crt"));
    EXPECT_EQ(c->engine.workers.join.kv_store_tls_cert_pem(), files.Read("client.crt"));
    EXPECT_EQ(c->engine.workers.join.kv_store_tls_key_pem(), files.Read("client.key"));
    EXPECT_EQ(c->engine.kv_store_tls.ca_pem, files.Read("ca.crt"));
  }
  {
    absl::FlagSaver restore;  // TLS files for a plaintext URL, or for none
    absl::SetFlag(&FLAGS_kv_store_url, "redis://redis.kv:6379");
    set_files();
    absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
    ASSERT_FALSE(c.ok());
    EXPECT_TRUE(absl::StrContains(c.status().message(), "--kv_store_tls_")) << c.status();
    absl::SetFlag(&FLAGS_kv_store_url, "");
    EXPECT_FALSE(CoordinatorConfigFromFlags().ok());
  }
  {
    absl::FlagSaver restore;  // a key others may read
    absl::SetFlag(&FLAGS_kv_store_url, "rediss://redis.kv:6380");
    set_files();
    ASSERT_EQ(::chmod(files.Path("client.key").c_str(), 0644), 0);
    absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
    ASSERT_FALSE(c.ok());
    EXPECT_TRUE(absl::StrContains(c.status().message(), "--kv_store_tls_key_file")) << c.status();
    ASSERT_EQ(::chmod(files.Path("client.key").c_str(), 0600), 0);
  }
  {
    absl::FlagSaver restore;  // the server's key with the client's certificate: they do not match
    absl::SetFlag(&FLAGS_kv_store_url, "rediss://redis.kv:6380");
    set_files();
    ASSERT_EQ(::chmod(files.Path("server.key").c_str(), 0600), 0);
    absl::SetFlag(&FLAGS_kv_store_tls_key_file, files.Path("server.key"));
    absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(c.status().message(), "--kv_store_tls_")) << c.status();
    const std::string key = files.Read("server.key");
    EXPECT_FALSE(absl::StrContains(c.status().message(), key.substr(40, 20))) << c.status();
    absl::SetFlag(&FLAGS_kv_store_tls_key_file, files.Path("client.key"));
    absl::SetFlag(&FLAGS_kv_store_tls_ca_file, files.Path("client.key"));  // not certificates
    EXPECT_FALSE(CoordinatorConfigFromFlags().ok());
  }
}

// The URL from a file, so its password is in no argv: the file's mode is
// checked as a secret's, its one line parsed as --kv_store_url's, and no
// error quotes the password.
TEST_F(CoordinatorConfigTest, KvStoreUrlFromASecretFile) {
  const std::string dir = testing::MakeTempDir("kv-store-url");
  ASSERT_FALSE(dir.empty());
  auto write = [&](const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  };
  for (mode_t mode : {0600, 0400, 0440, 0640}) {
    absl::FlagSaver restore;
    absl::SetFlag(&FLAGS_kv_store_url_file, write(absl::StrCat("good-", mode), "redis://:s3cret@redis.kv:6379/1\n", mode));
    absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->engine.kv_store_url, "redis://:s3cret@redis.kv:6379/1");
    EXPECT_EQ(c->engine.workers.join.kv_store_url(), "redis://:s3cret@redis.kv:6379/1");
  }
  struct Case {
    std::string path;
    std::string says;
  };
  const std::vector<Case> cases = {
      {write("world", "redis://:s3cret@redis.kv:6379", 0644), "mode 0644"},
      {write("others", "redis://:s3cret@redis.kv:6379", 0604), "mode 0604"},
      {write("group-writes", "redis://:s3cret@redis.kv:6379", 0660), "mode 0660"},
      {write("bad-port", "redis://:s3cret@redis.kv:port", 0600), "port"},
      {write("two-lines", "redis://:s3cret@a:1\nredis://:s3cret@b:2", 0600), "one line"},
      {write("empty", "\n", 0600), "one line"},
      {dir + "/missing", "cannot open"},
      {dir, "not a regular file"},
  };
  for (const Case& k : cases) {
    absl::FlagSaver restore;
    absl::SetFlag(&FLAGS_kv_store_url_file, k.path);
    absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
    ASSERT_FALSE(c.ok()) << k.path;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_TRUE(absl::StrContains(c.status().message(), "--kv_store_url_file")) << c.status();
    EXPECT_TRUE(absl::StrContains(c.status().message(), k.says)) << c.status();
    EXPECT_FALSE(absl::StrContains(c.status().message(), "s3cret")) << c.status();
  }
  absl::FlagSaver restore;  // one source of the URL
  absl::SetFlag(&FLAGS_kv_store_url_file, write("also-good", "redis://:s3cret@redis.kv:6379", 0600));
  absl::SetFlag(&FLAGS_kv_store_url, "redis://:s3cret@redis.kv:6379");
  absl::StatusOr<CoordinatorConfig> both = CoordinatorConfigFromFlags();
  ASSERT_FALSE(both.ok());
  EXPECT_TRUE(absl::StrContains(both.status().message(), "exclusive")) << both.status();
}

TEST_F(CoordinatorConfigTest, TheHttpGuardIsCheckedWhetherOrNotTheApiIsOn) {
  absl::SetFlag(&FLAGS_http_max_body_bytes, 10);
  absl::StatusOr<CoordinatorConfig> c = CoordinatorConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<http::Options> http = HttpOptionsFor(*c, 4096);
  ASSERT_FALSE(http.ok());
  EXPECT_TRUE(absl::StrContains(http.status().message(), "--http_max_body_bytes")) << http.status();
}

}  // namespace
}  // namespace chunkattn
