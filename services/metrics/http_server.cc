#include "services/metrics/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/constant_time.h"

namespace chunkattn::metrics {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";

std::string Response(int code, absl::string_view reason, absl::string_view content_type, absl::string_view body,
                     bool head, absl::string_view extra_headers = "") {
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n", extra_headers,
                                 "\r\n");
  if (!head) out.append(body.data(), body.size());
  return out;
}

}  // namespace

struct MetricsHttpServer::Connection {
  int fd = -1;
  std::string in;      // the request so far
  std::string out;     // the response, once the request is complete
  size_t sent = 0;
  bool peer_closed = false;
  Clock::time_point deadline;
  ~Connection() {
    if (fd >= 0) close(fd);
  }
};

MetricsHttpServer::MetricsHttpServer(std::function<std::string()> render, std::vector<std::string> bearer_tokens)
    : render_(std::move(render)), bearer_tokens_(std::move(bearer_tokens)) {}

MetricsHttpServer::~MetricsHttpServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host, int port,
                                                                           std::function<std::string()> render,
                                                                           std::vector<std::string> bearer_tokens) {
  in_addr addr;
  if (inet_pton(AF_INET, host.c_str(), &addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics server: host \"", host, "\" is not an IPv4 address"));
  }
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("metrics server: bad port ", port));
  if (!render) return absl::InvalidArgumentError("metrics server: no render function");

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(std::move(render), std::move(bearer_tokens)));
  server->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->listen_fd_ < 0 || server->wake_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("metrics server: ", std::strerror(errno)));
  }
  // SO_REUSEADDR only (restart over TIME_WAIT sockets); never SO_REUSEPORT,
  // so a second server on the port fails instead of sharing it.
  const int yes = 1;
  setsockopt(server->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr = addr;
  const std::string listen = absl::StrCat(host, ":", port);
  if (bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(server->listen_fd_, 1024) != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics server: cannot listen on ", listen, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(sa);
  getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  server->port_ = ntohs(sa.sin_port);
  server->thread_ = std::thread(&MetricsHttpServer::Loop, server.get());
  return server;
}

std::string MetricsHttpServer::Respond(const std::string& head_text) const {
  const std::vector<absl::string_view> lines = absl::StrSplit(head_text, "\r\n");
  const std::vector<absl::string_view> request_line = absl::StrSplit(lines[0], ' ');
  if (request_line.size() != 3 || !absl::StartsWith(request_line[2], "HTTP/1.")) {
    return Response(400, "Bad Request", kTextContentType, "Bad request\n", false);
  }
  const absl::string_view method = request_line[0];
  absl::string_view path = request_line[1];
  path = path.substr(0, path.find('?'));
  const bool is_metrics = path == "/metrics";
  if (!is_metrics && path != "/healthz") {
    return Response(404, "Not Found", kTextContentType, absl::StrCat("Not found: ", path, "\n"), false);
  }
  const bool head = method == "HEAD";
  if (!head && method != "GET") return Response(405, "Method Not Allowed", kTextContentType, "Method not allowed\n", false);
  if (!is_metrics) return Response(200, "OK", kTextContentType, "ok\n", head);
  if (!bearer_tokens_.empty()) {
    bool authorized = false;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos || !absl::EqualsIgnoreCase(lines[i].substr(0, colon), "authorization")) {
        continue;
      }
      const absl::string_view presented = BearerCredential(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      if (presented.empty()) continue;
      for (const std::string& token : bearer_tokens_) authorized |= ConstantTimeEquals(presented, token);
    }
    if (!authorized) {
      return Response(401, "Unauthorized", kTextContentType, "A bearer token is required\n", head,
                      "WWW-Authenticate: Bearer\r\n");
    }
  }
  return Response(200, "OK", kMetricsContentType, render_(), head);
}

void MetricsHttpServer::Loop() {
  std::list<Connection> connections;  // oldest first
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;
  while (true) {
    const Clock::time_point now = Clock::now();
    // Drop what is overdue or done.
    for (auto it = connections.begin(); it != connections.end();) {
      // Closed once the client has closed too: closing over unread request
      // bytes would send a reset that can destroy the response in flight.
      const bool done = !it->out.empty() && it->sent == it->out.size() && it->peer_closed;
      it = (done || now >= it->deadline) ? connections.erase(it) : std::next(it);
    }
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    int timeout_ms = 1000;
    for (Connection& c : connections) {
      const bool writing = !c.out.empty() && c.sent < c.out.size();
      fds.push_back({c.fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0});
      polled.push_back(&c);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count() + 1;
      timeout_ms = std::min<int>(timeout_ms, static_cast<int>(std::max<int64_t>(left, 0)));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;  // the destructor
    for (size_t i = 0; i < polled.size(); ++i) {
      Connection& c = *polled[i];
      const short ev = fds[i + 2].revents;
      if (ev == 0) continue;
      if (c.out.empty() || c.sent == c.out.size()) {
        char buf[4096];
        const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
        if (n == 0) c.peer_closed = true;
        if (n == 0 && c.out.empty()) c.deadline = Clock::time_point::min();  // gone before asking
        if (n < 0 && errno != EAGAIN && errno != EINTR) c.deadline = Clock::time_point::min();
        if (n <= 0 || !c.out.empty()) continue;  // after the response: read to the end, discard
        c.in.append(buf, static_cast<size_t>(n));
        const size_t end = c.in.find("\r\n\r\n");
        if (end != std::string::npos) {
          c.out = Respond(c.in.substr(0, end));
        } else if (c.in.size() > static_cast<size_t>(kMaxRequestBytes)) {
          c.out = Response(431, "Request Header Fields Too Large", kTextContentType, "Request too large\n", false);
        }
      }
      if (!c.out.empty() && c.sent < c.out.size()) {
        const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) {
          c.sent += static_cast<size_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          c.deadline = Clock::time_point::min();
        }
        if (c.sent == c.out.size()) shutdown(c.fd, SHUT_WR);
      }
    }
    if (fds[1].revents != 0) {
      while (true) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (static_cast<int>(connections.size()) >= kMaxConnections) connections.pop_front();
        Connection& c = connections.emplace_back();
        c.fd = fd;
        c.deadline = Clock::now() + std::chrono::milliseconds(kRequestTimeoutMs);
      }
    }
  }
}

}  // namespace chunkattn::metrics
