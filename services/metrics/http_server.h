// A small HTTP server for Prometheus scrapes and liveness probes, on civetweb:
//   GET /metrics  200, Content-Type: text/plain; version=0.0.4; charset=utf-8,
//                 the body that `render` returns
//   GET /healthz  200 "ok\n"
//   other paths   404; other methods on those paths 405 (HEAD is served as GET
//                 without the body)
// Each connection serves one request and is closed (no keep-alive), so an idle
// scraper never holds one of the few worker threads.
//
// Thread-safe. `render` is called on the server's worker threads, possibly on
// several at once, so it must be thread-safe (Registry::Serialize is). The
// destructor stops the server and waits for requests in flight, so whatever
// `render` uses must outlive the server.
#ifndef CHUNKATTN_SERVICES_METRICS_HTTP_SERVER_H_
#define CHUNKATTN_SERVICES_METRICS_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct mg_connection;
struct mg_context;

namespace chunkattn::metrics {

class MetricsHttpServer {
 public:
  // Listens on `host`:`port` and serves until destroyed. `host` is an IPv4
  // literal ("0.0.0.0" for every interface, "127.0.0.1"); the Debian civetweb
  // build has no IPv6. `port` 0 picks a free port (see port()).
  // INVALID_ARGUMENT: host not an IPv4 literal, port outside [0, 65535], no
  // render. UNAVAILABLE: the server could not start, e.g. the port is in use
  // (the message has civetweb's reason).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, std::function<std::string()> render);

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;
  ~MetricsHttpServer();

  // The port actually bound (the chosen one when Start was given 0).
  int port() const { return port_; }

 private:
  explicit MetricsHttpServer(std::function<std::string()> render);
  static int HandleRequest(mg_connection* conn, void* self);

  const std::function<std::string()> render_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  uint32_t wake_addr_ = 0;  // IPv4, network order: where the destructor connects to wake civetweb
};

}  // namespace chunkattn::metrics

#endif  // CHUNKATTN_SERVICES_METRICS_HTTP_SERVER_H_
