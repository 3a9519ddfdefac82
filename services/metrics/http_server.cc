#include "services/metrics/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace chunkattn::metrics {
namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// civetweb reports why it failed to start (e.g. "cannot bind to ...: Address
// already in use") only through log_message, on the thread calling
// mg_start2; its mg_error_data text is just "Failed to setup server ports".
thread_local std::string* start_log = nullptr;

int LogMessage(const mg_connection* /*conn*/, const char* message) {
  if (start_log != nullptr) {
    if (!start_log->empty()) start_log->append("; ");
    start_log->append(message);
  }
  return 1;  // handled: civetweb logs nothing more (no error_log_file anyway)
}

// Opens and closes a connection to the server, to wake its accept loop.
void Poke(uint32_t addr, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  timeval timeout = {0, 100 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = addr;
  (void)connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  close(fd);
}

void InitCivetwebOnce() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

}  // namespace

MetricsHttpServer::MetricsHttpServer(std::function<std::string()> render)
    : render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() {
  if (ctx_ == nullptr) return;
  // mg_stop raises a flag and joins civetweb's threads, but its accept loop
  // only sees the flag when poll() returns, after up to 2 s
  // (SOCKET_TIMEOUT_QUANTUM). Connecting wakes it, so stopping takes
  // milliseconds. If the pokes fail, the stop is just slower.
  std::atomic<bool> stopped{false};
  std::thread stopper([this, &stopped] {
    mg_stop(ctx_);  // waits for requests in flight
    stopped.store(true);
  });
  while (!stopped.load()) {
    Poke(wake_addr_, port_);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stopper.join();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, std::function<std::string()> render) {
  in_addr addr;
  if (inet_pton(AF_INET, host.c_str(), &addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics server: host \"", host, "\" is not an IPv4 address"));
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics server: bad port ", port));
  }
  if (!render) return absl::InvalidArgumentError("metrics server: no render function");
  InitCivetwebOnce();

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(std::move(render)));
  const std::string listen = absl::StrCat(host, ":", port);
  const char* options[] = {
      "listening_ports", listen.c_str(),
      "num_threads", "3",
      "enable_keep_alive", "no",
      "request_timeout_ms", "10000",  // a stalled client frees its thread
      nullptr,
  };
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = &LogMessage;
  mg_init_data init = {&callbacks, server.get(), options};
  char error_text[256] = "";
  unsigned error_code = 0;
  mg_error_data error = {&error_code, error_text, sizeof(error_text)};

  std::string log;
  start_log = &log;
  server->ctx_ = mg_start2(&init, &error);
  start_log = nullptr;
  if (server->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("metrics server: cannot listen on ", listen, ": ",
                                               log.empty() ? error_text : log));
  }

  mg_server_port ports[1];
  if (mg_get_server_ports(server->ctx_, 1, ports) != 1) {
    return absl::InternalError(absl::StrCat("metrics server: no bound port for ", listen));
  }
  server->port_ = ports[0].port;
  // To wake the server, a connection to the address it listens on (loopback
  // when that is every interface).
  server->wake_addr_ = addr.s_addr == htonl(INADDR_ANY) ? htonl(INADDR_LOOPBACK) : addr.s_addr;
  // "/" is a prefix of every path: one handler routes them all exactly.
  mg_set_request_handler(server->ctx_, "/", &MetricsHttpServer::HandleRequest, server.get());
  return server;
}

int MetricsHttpServer::HandleRequest(mg_connection* conn, void* self) {
  const mg_request_info* info = mg_get_request_info(conn);
  const std::string path = info->local_uri != nullptr ? info->local_uri : "";
  const bool is_metrics = path == "/metrics";
  if (!is_metrics && path != "/healthz") {
    mg_send_http_error(conn, 404, "Not found: %s\n", path.c_str());
    return 404;
  }
  const bool head = std::strcmp(info->request_method, "HEAD") == 0;
  if (!head && std::strcmp(info->request_method, "GET") != 0) {
    mg_send_http_error(conn, 405, "Method not allowed\n");
    return 405;
  }
  const std::string body =
      is_metrics ? static_cast<MetricsHttpServer*>(self)->render_() : std::string("ok\n");
  mg_send_http_ok(conn, is_metrics ? kMetricsContentType : "text/plain; charset=utf-8",
                  static_cast<long long>(body.size()));
  if (!head) mg_write(conn, body.data(), body.size());
  return 200;
}

}  // namespace chunkattn::metrics
