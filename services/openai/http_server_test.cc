#include "services/openai/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace chunkattn::http {
namespace {

// A blocking client socket on 127.0.0.1 with a 10 s receive bound.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  void Send(const std::string& data) { ASSERT_EQ(write(fd_, data.data(), data.size()), static_cast<ssize_t>(data.size())); }
  // Reads until `until` appears (or the peer closes, or 10 s pass).
  std::string ReadUntil(const std::string& until) {
    std::string got;
    char buffer[4096];
    while (!absl::StrContains(got, until)) {
      const ssize_t n = read(fd_, buffer, sizeof(buffer));
      if (n <= 0) break;
      got.append(buffer, n);
    }
    return got;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string Post(const std::string& path, const std::string& body) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
}

TEST(HttpServerTest, RepliesAndKeepsTheConnection) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start({"127.0.0.1", 0}, [](Request r, std::shared_ptr<Reply> reply) {
        reply->Send(200, "text/plain", absl::StrCat(r.method, " ", r.path, " [", r.body, "] ", r.authorization));
      });
  ASSERT_TRUE(server.ok()) << server.status();
  Client c((*server)->port());
  ASSERT_TRUE(c.connected());
  c.Send(absl::StrCat(Post("/a?x=1", "hello").substr(0, 30)));  // in two pieces
  c.Send(Post("/a?x=1", "hello").substr(30));
  std::string got = c.ReadUntil("hello] ");
  EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 200")) << got;
  EXPECT_TRUE(absl::StrContains(got, "POST /a [hello] ")) << got;
  // The same connection serves the next request.
  c.Send("GET /b HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n");
  got = c.ReadUntil("Bearer t");
  EXPECT_TRUE(absl::StrContains(got, "GET /b [] Bearer t")) << got;
}

TEST(HttpServerTest, RefusesOversizedBodiesAndOtherMethods) {
  Options o{"127.0.0.1", 0};
  o.max_body_bytes = 1024;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(o, [](Request, std::shared_ptr<Reply> reply) { reply->Send(200, "text/plain", "ok"); });
  ASSERT_TRUE(server.ok()) << server.status();
  {
    Client c((*server)->port());
    c.Send(Post("/", std::string(2048, 'x')));
    EXPECT_TRUE(absl::StartsWith(c.ReadUntil("\r\n\r\n"), "HTTP/1.1 413"));
  }
  {
    Client c((*server)->port());
    c.Send("DELETE / HTTP/1.1\r\nHost: x\r\n\r\n");  // libevent: 501 Not Implemented
    EXPECT_TRUE(absl::StartsWith(c.ReadUntil("\r\n\r\n"), "HTTP/1.1 501"));
  }
  {
    Client c((*server)->port());
    c.Send(Post("/", std::string(1000, 'x')));
    EXPECT_TRUE(absl::StartsWith(c.ReadUntil("ok"), "HTTP/1.1 200"));
  }
}

TEST(HttpServerTest, StreamsFromAnotherThread) {
  std::vector<std::thread> writers;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start({"127.0.0.1", 0}, [&writers](Request, std::shared_ptr<Reply> reply) {
        writers.emplace_back([reply] {
          reply->StartStream(200, "text/event-stream");
          for (int i = 0; i < 3; ++i) {
            reply->Write(absl::StrCat("data: ", i, "\n\n"));
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
          reply->Write("data: [DONE]\n\n");
          reply->End();
          reply->Write("dropped");  // after End: dropped
        });
      });
  ASSERT_TRUE(server.ok()) << server.status();
  Client c((*server)->port());
  c.Send(Post("/s", "{}"));
  const std::string got = c.ReadUntil("\r\n0\r\n\r\n");  // the chunked coding's last chunk
  EXPECT_TRUE(absl::StrContains(got, "Transfer-Encoding: chunked")) << got;
  EXPECT_TRUE(absl::StrContains(got, "data: 2\n\n")) << got;
  EXPECT_TRUE(absl::StrContains(got, "data: [DONE]")) << got;
  EXPECT_FALSE(absl::StrContains(got, "dropped")) << got;
  for (std::thread& t : writers) t.join();
}

TEST(HttpServerTest, ClientThatLeavesRunsOnClose) {
  std::atomic<int> closed{0};
  std::shared_ptr<Reply> held;
  absl::Notification started;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start({"127.0.0.1", 0}, [&](Request, std::shared_ptr<Reply> reply) {
        reply->OnClose([&closed] { ++closed; });
        reply->StartStream(200, "text/event-stream");
        reply->Write("data: 0\n\n");
        held = reply;
        started.Notify();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  {
    Client c((*server)->port());
    c.Send(Post("/s", "{}"));
    c.ReadUntil("data: 0");
  }
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (int i = 0; i < 1000 && closed.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(closed.load(), 1);
  EXPECT_TRUE(held->closed());
  held->Write("late");  // dropped, no crash
  held->End();
  // OnClose set after the client left runs at once.
  int late = 0;
  held->OnClose([&late] { ++late; });
  EXPECT_EQ(late, 1);
}

TEST(HttpServerTest, StoppingEndsOpenReplies) {
  std::atomic<int> closed{0};
  std::shared_ptr<Reply> held;
  absl::Notification started;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start({"127.0.0.1", 0}, [&](Request, std::shared_ptr<Reply> reply) {
        reply->OnClose([&closed] { ++closed; });
        held = reply;
        started.Notify();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  Client c((*server)->port());
  c.Send(Post("/s", "{}"));
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  server->reset();
  EXPECT_EQ(closed.load(), 1);
  held->Send(200, "text/plain", "too late");  // the server is gone: dropped
}

TEST(HttpServerTest, ManyConcurrentStreams) {
  constexpr int kClients = 200;
  std::vector<std::thread> writers;
  std::mutex mu;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start({"127.0.0.1", 0}, [&](Request r, std::shared_ptr<Reply> reply) {
        std::lock_guard<std::mutex> lock(mu);
        writers.emplace_back([reply, body = r.body] {
          reply->StartStream(200, "text/event-stream");
          for (int i = 0; i < 5; ++i) reply->Write(absl::StrCat("data: ", body, "-", i, "\n\n"));
          reply->End();
        });
      });
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>((*server)->port()));
    ASSERT_TRUE(clients.back()->connected());
    clients.back()->Send(Post("/s", std::to_string(i)));
  }
  for (int i = 0; i < kClients; ++i) {
    const std::string got = clients[i]->ReadUntil("\r\n0\r\n\r\n");
    EXPECT_TRUE(absl::StrContains(got, absl::StrCat("data: ", i, "-4\n\n"))) << i << ": " << got;
  }
  std::lock_guard<std::mutex> lock(mu);
  for (std::thread& t : writers) t.join();
}

TEST(HttpServerTest, BadOptions) {
  auto handler = [](Request, std::shared_ptr<Reply>) {};
  EXPECT_TRUE(absl::IsInvalidArgument(HttpServer::Start({"localhost", 0}, handler).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(HttpServer::Start({"127.0.0.1", 70000}, handler).status()));
  Options tls{"127.0.0.1", 0};
  tls.tls_cert_file = "/nonexistent.pem";
  EXPECT_TRUE(absl::IsInvalidArgument(HttpServer::Start(tls, handler).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(HttpServer::Start({"127.0.0.1", 0}, nullptr).status()));
  absl::StatusOr<std::unique_ptr<HttpServer>> first = HttpServer::Start({"127.0.0.1", 0}, handler);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(absl::IsUnavailable(HttpServer::Start({"127.0.0.1", (*first)->port()}, handler).status()));
}

}  // namespace
}  // namespace chunkattn::http
