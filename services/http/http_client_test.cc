#include "services/http/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/http/http_server.h"

namespace chunkattn::http {
namespace {

TEST(ParseBaseUrlTest, AcceptsHttpHostPortPrefix) {
  absl::StatusOr<BaseUrl> u = ParseBaseUrl("http://127.0.0.1:8000");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8000);
  EXPECT_EQ(u->prefix, "");
  u = ParseBaseUrl("http://[::1]:9/api/");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 9);
  EXPECT_EQ(u->prefix, "/api");
  u = ParseBaseUrl("http://gateway");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->port, 80);
  for (const char* bad : {"", "127.0.0.1:8000", "https://h:1", "ftp://h:1", "http://:80", "http://h:0",
                          "http://h:99999", "http://h:1/?q=1", "http://u@h:1", "http://h:1/#f", "http://h:x"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseBaseUrl(bad).status())) << bad;
  }
}

// The same events whichever way the bytes are cut.
TEST(EventStreamParserTest, EventsAreTheSameForAnySplit) {
  const std::string stream =
      ": a comment\r\n"
      "data: {\"a\": 1}\r\n\r\n"
      "event: x\n"
      "data: line one\n"
      "data:line two\n"
      "id: 4\n\n"
      "retry: 10\n\n"  // no data: no event
      "data\n\n"       // a field without a colon: empty data
      "data: [DONE]\n\n"
      "data: unfinished";  // never dispatched
  const std::vector<std::string> want = {"{\"a\": 1}", "line one\nline two", "", "[DONE]"};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> got;
    EventStreamParser parser([&got](absl::string_view data) { got.emplace_back(data); });
    size_t at = 0;
    while (at < stream.size()) {
      const size_t n = trial == 0 ? 1 : std::uniform_int_distribution<size_t>(0, 12)(rng);
      parser.Feed(absl::string_view(stream).substr(at, n));
      at += n;
    }
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

Options LocalOptions() {
  Options o;
  o.host = "127.0.0.1";
  o.port = 0;
  return o;
}

ClientRequest Req(std::string method, std::string path, std::string body = "") {
  ClientRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.body = std::move(body);
  return r;
}

class HttpClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start(LocalOptions(), [this](Request r, std::shared_ptr<Reply> reply) { Handle(r, reply); });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    base_ = {"127.0.0.1", server_->port(), ""};
  }
  void TearDown() override {
    server_.reset();  // ends replies still open
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : writers_) t.join();
  }

  void Handle(const Request& r, const std::shared_ptr<Reply>& reply) {
    if (r.path == "/stream") {
      std::lock_guard<std::mutex> lock(mu_);
      writers_.emplace_back([reply, n = std::stoi(r.body)] {
        reply->StartStream(200, "text/event-stream");
        for (int i = 0; i < n; ++i) {
          reply->Write(absl::StrCat("data: ", i, "\n\n"));
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        reply->Write("data: [DONE]\n\n");
        reply->End();
      });
    } else if (r.path == "/api/echo") {
      reply->Send(200, "application/json", absl::StrCat(r.method, "|", r.body, "|", r.authorization, "|", r.request_id));
    } else if (r.path == "/silent") {
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back(reply);  // never answered
    } else {
      reply->Send(404, "application/json", "{\"error\": \"no\"}");
    }
  }

  std::unique_ptr<HttpServer> server_;
  BaseUrl base_;
  std::mutex mu_;
  std::vector<std::thread> writers_;
  std::vector<std::shared_ptr<Reply>> held_;
};

TEST_F(HttpClientTest, StreamsEventsInOrderAsTheyArrive) {
  std::vector<std::string> events;
  absl::StatusOr<ClientReply> reply =
      Call(base_, Req("POST", "/stream", "40"), [&events](absl::string_view data) { events.emplace_back(data); });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->content_type, "text/event-stream");
  EXPECT_EQ(reply->body, "");
  ASSERT_EQ(events.size(), 41u);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(events[i], std::to_string(i));
  EXPECT_EQ(events.back(), "[DONE]");
  // Without a handler the stream is the body.
  reply = Call(base_, Req("POST", "/stream", "2"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->body, "data: 0\n\ndata: 1\n\ndata: [DONE]\n\n");
}

TEST_F(HttpClientTest, SendsHeadersUnderThePrefixAndReturnsAnyStatus) {
  ClientRequest request = Req("POST", "/echo", "{\"x\": 1}");
  request.bearer_token = "tok";
  request.request_id = "req-7";
  absl::StatusOr<ClientReply> reply = Call({"127.0.0.1", base_.port, "/api"}, request);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, "POST|{\"x\": 1}|Bearer tok|req-7");
  int events = 0;
  reply = Call(base_, Req("GET", "/missing"), [&events](absl::string_view) { ++events; });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 404);
  EXPECT_EQ(reply->body, "{\"error\": \"no\"}");
  EXPECT_EQ(events, 0);  // not an event stream
}

TEST_F(HttpClientTest, ManyThreadsAtOnce) {
  constexpr int kThreads = 32;
  std::vector<int> counts(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<ClientReply> r = Call(base_, Req("POST", "/stream", std::to_string(t)),
                                           [&counts, t](absl::string_view) { ++counts[t]; });
      if (!r.ok() || r->status != 200) counts[t] = -1;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(counts[t], t + 1) << t;
}

TEST_F(HttpClientTest, TimeoutsRefusalsAndBadRequests) {
  ClientRequest silent = Req("POST", "/silent", "{}");
  silent.timeout = absl::Milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<ClientReply> reply = Call(base_, silent);
  EXPECT_TRUE(absl::IsDeadlineExceeded(reply.status())) << reply.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  // A port nothing listens on: bind one, then close it.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  reply = Call({"127.0.0.1", ntohs(addr.sin_port), ""}, Req("GET", "/"));
  EXPECT_TRUE(absl::IsUnavailable(reply.status())) << reply.status();
  EXPECT_TRUE(absl::IsInvalidArgument(Call(base_, Req("DELETE", "/")).status()));
  ClientRequest zero = Req("GET", "/");
  zero.timeout = absl::ZeroDuration();
  EXPECT_TRUE(absl::IsInvalidArgument(Call(base_, zero).status()));
}

}  // namespace
}  // namespace chunkattn::http
