#include "services/metrics/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "services/metrics/metrics.h"

namespace chunkattn::metrics {
namespace {

struct HttpResponse {
  int status = 0;  // 0: no response (connect failed, timeout, garbage)
  std::string content_type;
  std::string body;
};

// A connected socket to 127.0.0.1:`port` with 5 s send/receive timeouts, or -1.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// One HTTP/1.1 request to 127.0.0.1:`port` on a raw socket; reads until the
// server closes, giving up after about 5 s. `headers`: extra lines, each
// ending in \r\n; `raw_request` replaces the whole request when non-empty.
HttpResponse Fetch(int port, const std::string& path, const std::string& method = "GET",
                   const std::string& headers = "", const std::string& raw_request = "") {
  HttpResponse response;
  const int fd = Connect(port);
  if (fd < 0) return response;
  std::string raw;
  const std::string request =
      !raw_request.empty() ? raw_request
                           : absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n", headers,
                                          "Connection: close\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    char buf[4096];
    ssize_t n;
    while (std::chrono::steady_clock::now() < deadline && (n = recv(fd, buf, sizeof(buf), 0)) > 0) {
      raw.append(buf, n);
    }
  }
  close(fd);

  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return response;
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &response.status)) {
    return response;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon != std::string::npos &&
        absl::AsciiStrToLower(lines[i].substr(0, colon)) == "content-type") {
      response.content_type = std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
  }
  response.body = raw.substr(end + 4);
  return response;
}

class MetricsHttpServerTest : public testing::Test {
 protected:
  void SetUp() override {
    registry_.GetCounter("chunkattn_prompt_tokens_total", "Prompt tokens received.").Increment(42);
    registry_.GetGauge("chunkattn_kv_chunks", "KV chunks by state.", {{"state", "used"}}).Set(3);
    auto server =
        MetricsHttpServer::Start("127.0.0.1", 0, [this] { return registry_.Serialize(); });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
  }

  Registry registry_;  // outlives server_: render reads it
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, ServesMetrics) {
  const HttpResponse r = Fetch(server_->port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.body, registry_.Serialize());
  EXPECT_TRUE(absl::StrContains(r.body, "\nchunkattn_prompt_tokens_total 42\n")) << r.body;

  // Each scrape renders afresh; a query string does not change the path.
  registry_.GetCounter("chunkattn_prompt_tokens_total", "").Increment();
  EXPECT_TRUE(absl::StrContains(Fetch(server_->port(), "/metrics?x=1").body,
                                "\nchunkattn_prompt_tokens_total 43\n"));
}

TEST_F(MetricsHttpServerTest, ServesHealthz) {
  const HttpResponse r = Fetch(server_->port(), "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
}

TEST_F(MetricsHttpServerTest, OtherPathsAndMethods) {
  for (const char* path : {"/", "/metricsx", "/metrics/x", "/healthz/", "/favicon.ico"}) {
    EXPECT_EQ(Fetch(server_->port(), path).status, 404) << path;
  }
  EXPECT_EQ(Fetch(server_->port(), "/metrics", "POST").status, 405);
  const HttpResponse head = Fetch(server_->port(), "/metrics", "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
}

TEST_F(MetricsHttpServerTest, ConcurrentScrapes) {
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) ok += Fetch(server_->port(), "/metrics").status == 200;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 6 * 20);
}

// Finding 7 of the reliability issue: three idle connections held civetweb's
// three threads for its 10 s timeout, and /metrics did not answer.
TEST_F(MetricsHttpServerTest, IdleAndSlowConnectionsDoNotStarveAScrape) {
  std::vector<int> idle;
  for (int i = 0; i < MetricsHttpServer::kMaxConnections + 40; ++i) {
    const int fd = Connect(server_->port());
    ASSERT_GE(fd, 0);
    if (i % 2 == 1) {  // half of them send part of a request, then stall
      const std::string part = "GET /metr";
      ASSERT_EQ(send(fd, part.data(), part.size(), MSG_NOSIGNAL), static_cast<ssize_t>(part.size()));
    }
    idle.push_back(fd);
  }
  for (int i = 0; i < 5; ++i) {
    const HttpResponse r = Fetch(server_->port(), "/metrics");
    EXPECT_EQ(r.status, 200);
    EXPECT_TRUE(absl::StrContains(r.body, "chunkattn_prompt_tokens_total 42"));
  }
  for (int fd : idle) close(fd);
}

TEST_F(MetricsHttpServerTest, MalformedAndOversizedRequests) {
  EXPECT_EQ(Fetch(server_->port(), "", "", "", "NONSENSE\r\n\r\n").status, 400);
  EXPECT_EQ(Fetch(server_->port(), "", "", "", "GET /metrics SPDY/9\r\n\r\n").status, 400);
  EXPECT_EQ(Fetch(server_->port(), "/metrics", "GET", "X-Big: " + std::string(20000, 'a') + "\r\n").status, 431);
  EXPECT_EQ(Fetch(server_->port(), "/metrics?x=1").status, 200);
  EXPECT_EQ(Fetch(server_->port(), "/metrics").status, 200);  // unharmed
}

TEST(MetricsHttpServerTokenTest, MetricsNeedATokenHealthzDoesNot) {
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("m 1\n"); },
                                         {"new-secret", "old-secret"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_EQ(Fetch(port, "/metrics").status, 401);
  EXPECT_EQ(Fetch(port, "/metrics", "GET", "Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_EQ(Fetch(port, "/metrics", "GET", "Authorization: new-secret\r\n").status, 401);
  EXPECT_EQ(Fetch(port, "/metrics", "GET", "Authorization: Bearer new-secre\r\n").status, 401);
  for (const char* token : {"new-secret", "old-secret"}) {
    const HttpResponse r = Fetch(port, "/metrics", "GET", absl::StrCat("authorization: bearer ", token, "\r\n"));
    EXPECT_EQ(r.status, 200) << token;
    EXPECT_EQ(r.body, "m 1\n");
  }
  EXPECT_EQ(Fetch(port, "/healthz").status, 200);
}

TEST_F(MetricsHttpServerTest, PortInUseIsUnavailable) {
  auto second = MetricsHttpServer::Start("127.0.0.1", server_->port(), [] { return ""; });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "in use")) << second.status();
  // The first server is unharmed.
  EXPECT_EQ(Fetch(server_->port(), "/healthz").status, 200);
}

TEST_F(MetricsHttpServerTest, DestructorStopsServing) {
  const int port = server_->port();
  server_.reset();
  EXPECT_EQ(Fetch(port, "/healthz").status, 0);
}

TEST(MetricsHttpServerStartTest, RejectsBadArguments) {
  auto render = [] { return std::string(); };
  EXPECT_EQ(MetricsHttpServer::Start("localhost", 0, render).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start("::1", 0, render).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start("127.0.0.1", 65536, render).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start("127.0.0.1", -1, render).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start("127.0.0.1", 0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn::metrics
