#include "base/redis_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/tests/redis_server.h"
#include "gtest/gtest.h"

namespace chunkattn {
namespace {

TEST(RedisUrlTest, Parses) {
  absl::StatusOr<RedisUrl> u = ParseRedisUrl("redis://127.0.0.1:6380/2");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->db, 2);
  EXPECT_TRUE(u->password.empty());

  u = ParseRedisUrl("redis://:s%40cret@redis.kv.svc:6379");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->password, "s@cret");
  EXPECT_EQ(u->host, "redis.kv.svc");
  EXPECT_EQ(u->Redacted(), "redis://:***@redis.kv.svc:6379");

  u = ParseRedisUrl("redis://alice:pw@[::1]:7000");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->user, "alice");
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->Redacted(), "redis://alice:***@[::1]:7000");

  u = ParseRedisUrl("redis://localhost");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->port, 6379);
}

TEST(RedisUrlTest, RefusesBadUrlsWithoutQuotingThePassword) {
  for (const char* bad : {"", "http://h:1", "redis://", "redis://:6379", "redis://h:0", "redis://h:65536",
                          "redis://h:x", "redis://h:1/-1", "redis://h:1/x", "redis://:@h:1", "redis://user@h:1",
                          "redis://:pw%zz@h:1", "redis://h h:1", "redis://h:1?x=1", "redis://[::1:1"}) {
    absl::StatusOr<RedisUrl> u = ParseRedisUrl(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(u.status())) << bad << ": " << u.status();
  }
  absl::StatusOr<RedisUrl> u = ParseRedisUrl("redis://:hunter2@h:x");
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(std::string(u.status().message()).find("hunter2"), std::string::npos) << u.status();
}

TEST(RedisUrlTest, ParsesRediss) {
  absl::StatusOr<RedisUrl> u = ParseRedisUrl("rediss://:pw@redis.kv.svc:6380/1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_TRUE(u->tls);
  EXPECT_EQ(u->host, "redis.kv.svc");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->db, 1);
  EXPECT_EQ(u->Redacted(), "rediss://:***@redis.kv.svc:6380/1");
  EXPECT_FALSE(ParseRedisUrl("redis://h:1")->tls);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseRedisUrl("redisss://h:1").status()));
  EXPECT_EQ(RedactRedisUrl("rediss://:hunter2@h:1"), "rediss://:***@h:1");
}

TEST(RedisUrlTest, RedactsAnything) {
  EXPECT_EQ(RedactRedisUrl("redis://:hunter2@h:1/0"), "redis://:***@h:1/0");
  EXPECT_EQ(RedactRedisUrl("redis://bob:hunter2@h:1"), "redis://bob:***@h:1");
  EXPECT_EQ(RedactRedisUrl("redis://hunter2@h"), "redis://***@h");
  EXPECT_EQ(RedactRedisUrl("redis://h:1"), "redis://h:1");
}

class RedisClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start()) << "cannot start redis-server (scripts/install-deps.sh installs it)";
  }
  RedisServerForTest server_{"pw"};
};

TEST_F(RedisClientTest, SetGetExists) {
  RedisClient client(server_.url(), RedisOptions());
  const std::string value("\0\r\nbinary\xff", 11);
  ASSERT_TRUE(client.Set("k1", value, absl::ZeroDuration()).ok());
  ASSERT_TRUE(client.Set("k2", "v", absl::Seconds(60)).ok());
  absl::StatusOr<std::optional<std::string>> got = client.Get("k1", 64);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, value);
  got = client.Get("missing", 64);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());
  absl::StatusOr<std::vector<int64_t>> n = client.ExistsEach({{"k1", "k2"}, {"k1", "missing"}, {"missing"}});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, (std::vector<int64_t>{2, 1, 0}));
}

TEST_F(RedisClientTest, OversizedValueIsRefusedAndTheClientGoesOn) {
  RedisClient client(server_.url(), RedisOptions());
  ASSERT_TRUE(client.Set("big", std::string(1000, 'x'), absl::ZeroDuration()).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(client.Get("big", 999).status()));
  absl::StatusOr<std::optional<std::string>> got = client.Get("big", 1000);  // no back-off for that
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->size(), 1000u);
}

TEST_F(RedisClientTest, WrongPasswordIsPermissionDenied) {
  RedisUrl url = server_.url();
  url.password = "wrong";
  RedisClient client(url, RedisOptions());
  const absl::Status s = client.Ping();
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(std::string(s.message()).find("wrong"), std::string::npos) << s;
  url.password.clear();
  RedisClient anonymous(url, RedisOptions());
  EXPECT_FALSE(anonymous.Ping().ok());  // NOAUTH on the first command
}

TEST_F(RedisClientTest, DownServerFailsFastAndBacksOff) {
  RedisOptions options;
  options.retry_after = absl::Seconds(30);
  RedisClient client(server_.url(), options);
  ASSERT_TRUE(client.Ping().ok());
  server_.Kill();
  absl::Status s = client.Set("k", "v", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(client.Ping().ok());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));  // no dial within retry_after
  EXPECT_FALSE(client.connected());
}

TEST(RedisClientTimeoutTest, SilentServerTimesOut) {
  // A listener that never answers: the connect succeeds (the kernel's
  // backlog), the command's deadline ends the wait.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  RedisUrl url;
  url.host = "127.0.0.1";
  url.port = ntohs(a.sin_port);
  RedisOptions options;
  options.io_timeout = absl::Milliseconds(100);
  RedisClient client(url, options);
  const absl::Time start = absl::Now();
  const absl::Status s = client.Get("k", 10).status();
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_GE(took, absl::Milliseconds(90));
  EXPECT_LT(took, absl::Seconds(2));
  // AUTH on connect is bounded by the connect timeout the same way.
  url.password = "pw";
  options.connect_timeout = absl::Milliseconds(100);
  RedisClient authed(url, options);
  const absl::Status auth = authed.Ping();
  EXPECT_TRUE(absl::IsDeadlineExceeded(auth)) << auth;
  ::close(fd);
}

TEST(RedisClientTimeoutTest, NobodyListening) {
  RedisUrl url;
  url.host = "127.0.0.1";
  url.port = 1;  // privileged and closed on a test machine
  RedisClient client(url, RedisOptions());
  EXPECT_TRUE(absl::IsUnavailable(client.Ping()));
}

class RedisTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(files_.Make()) << "cannot make certificates with openssl (scripts/install-deps.sh installs it)";
    server_ = std::make_unique<RedisServerForTest>("pw", files_.Server(/*auth_clients=*/true));
    ASSERT_TRUE(server_->Start()) << "cannot start redis-server with TLS";
  }
  RedisOptions Options(RedisTlsOptions tls) const {
    RedisOptions o;
    o.tls = std::move(tls);
    o.retry_after = absl::ZeroDuration();
    return o;
  }
  RedisTlsFilesForTest files_;
  std::unique_ptr<RedisServerForTest> server_;
};

TEST_F(RedisTlsTest, SetGetExistsOverTls) {
  RedisClient client(server_->url(), Options(files_.Client()));
  const std::string value(100000, '\x7f');  // several TLS records
  ASSERT_TRUE(client.Set("k", value, absl::Seconds(60)).ok());
  EXPECT_TRUE(client.encrypted());
  absl::StatusOr<std::optional<std::string>> got = client.Get("k", 1 << 20);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(**got, value);
  absl::StatusOr<std::vector<int64_t>> n = client.ExistsEach({{"k", "missing"}});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, (std::vector<int64_t>{1}));
}

TEST_F(RedisTlsTest, UntrustedServerIsRefused) {
  RedisTlsOptions tls = files_.Client();
  tls.ca_pem = files_.Read("other.crt");  // a CA that did not sign the server's certificate
  RedisClient client(server_->url(), Options(tls));
  const absl::Status s = client.Ping();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(std::string(s.message()).find("certificate"), std::string::npos) << s;
  EXPECT_FALSE(client.connected());
}

TEST_F(RedisTlsTest, CertificateForAnotherHostIsRefused) {
  RedisUrl url = server_->url();
  url.host = "localhost";  // the certificate names IP 127.0.0.1 only
  RedisClient client(url, Options(files_.Client()));
  const absl::Status s = client.Ping();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(std::string(s.message()).find("hostname mismatch"), std::string::npos) << s;
  EXPECT_FALSE(client.connected());
}

TEST_F(RedisTlsTest, MissingClientCertificateIsRefused) {
  RedisTlsOptions tls = files_.Client();
  tls.cert_pem.clear();
  tls.key_pem.clear();
  RedisClient client(server_->url(), Options(tls));
  EXPECT_FALSE(client.Ping().ok());  // the handshake or the first reply: TLS 1.3 reports it late
}

TEST_F(RedisTlsTest, PlaintextClientGetsNoAnswer) {
  RedisUrl url = server_->url();
  url.tls = false;
  RedisOptions o;
  o.io_timeout = absl::Milliseconds(300);
  o.connect_timeout = absl::Milliseconds(300);
  RedisClient client(url, o);
  EXPECT_FALSE(client.Ping().ok());
}

TEST(RedisTlsOptionsTest, ChecksPemWithoutQuotingTheKey) {
  RedisTlsFilesForTest files;
  ASSERT_TRUE(files.Make());
  EXPECT_TRUE(CheckRedisTlsOptions(files.Client()).ok());
  EXPECT_TRUE(CheckRedisTlsOptions({files.Read("ca.crt"), "", ""}).ok());
  EXPECT_TRUE(CheckRedisTlsOptions({}).ok());  // the system's CAs
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRedisTlsOptions({"not a certificate", "", ""})));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRedisTlsOptions({files.Read("ca.crt"), files.Read("client.crt"), ""})));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRedisTlsOptions({files.Read("ca.crt"), "", files.Read("client.key")})));
  const std::string wrong_key = files.Read("server.key");  // not the client certificate's
  const absl::Status s = CheckRedisTlsOptions({files.Read("ca.crt"), files.Read("client.crt"), wrong_key});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  const std::string garbage_key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END PRIVATE KEY-----\n";
  const absl::Status g = CheckRedisTlsOptions({files.Read("ca.crt"), files.Read("client.crt"), garbage_key});
  EXPECT_TRUE(absl::IsInvalidArgument(g)) << g;
  EXPECT_EQ(std::string(g.message()).find("c2VjcmV0"), std::string::npos) << g;
  // A client whose options do not parse fails its commands with that error, and never connects.
  RedisUrl url;
  url.tls = true;
  url.host = "127.0.0.1";
  url.port = 1;
  RedisOptions o;
  o.tls.ca_pem = "not a certificate";
  RedisClient client(url, o);
  EXPECT_TRUE(absl::IsInvalidArgument(client.Ping())) << client.Ping();
}

}  // namespace
}  // namespace chunkattn
