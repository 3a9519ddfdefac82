#include "base/redis_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

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
  EXPECT_TRUE(absl::IsUnimplemented(ParseRedisUrl("rediss://:pw@h:6380").status()));
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

}  // namespace
}  // namespace chunkattn
