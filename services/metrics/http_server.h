// A small HTTP server for Prometheus scrapes and liveness probes:
//   GET /metrics  200, Content-Type: text/plain; version=0.0.4; charset=utf-8,
//                 the body that `render` returns; with tokens, 401 unless the
//                 request carries `Authorization: Bearer <one of them>`
//   GET /healthz  200 "ok\n" (always open: probes carry no token)
//   other paths   404; other methods on those paths 405 (HEAD is served as GET
//                 without the body); a malformed or oversized request 400/431
// Each connection serves one request and is closed (no keep-alive).
//
// One thread polls every connection (non-blocking sockets), so an idle or slow
// client holds no thread: it costs one descriptor until its 5 s deadline, and
// past kMaxConnections the oldest connection is dropped for a new one. No
// number of idle connections can starve a scrape.
//
// Thread-safe. `render` is called on the server's thread. The destructor stops
// the server and joins its thread, so whatever `render` uses must outlive it.
#ifndef CHUNKATTN_SERVICES_METRICS_HTTP_SERVER_H_
#define CHUNKATTN_SERVICES_METRICS_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace chunkattn::metrics {

class MetricsHttpServer {
 public:
  static constexpr int kMaxConnections = 256;
  static constexpr int kMaxRequestBytes = 8192;  // request line and headers
  static constexpr int kRequestTimeoutMs = 5000;  // to send the request and take the response

  // Listens on `host`:`port` and serves until destroyed. `host` is an IPv4
  // literal ("0.0.0.0" for every interface, "127.0.0.1"). `port` 0 picks a
  // free port (see port()). `bearer_tokens` non-empty: /metrics requires one.
  // INVALID_ARGUMENT: host not an IPv4 literal, port outside [0, 65535], no
  // render. UNAVAILABLE: the port cannot be bound (the message says why,
  // e.g. "Address already in use").
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                  std::function<std::string()> render,
                                                                  std::vector<std::string> bearer_tokens = {});

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;
  ~MetricsHttpServer();

  // The port actually bound (the chosen one when Start was given 0).
  int port() const { return port_; }

 private:
  struct Connection;
  MetricsHttpServer(std::function<std::string()> render, std::vector<std::string> bearer_tokens);
  void Loop();
  // The whole response to one complete request head.
  std::string Respond(const std::string& head) const;

  const std::function<std::string()> render_;
  const std::vector<std::string> bearer_tokens_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: the destructor writes it to stop the loop
  int port_ = 0;
  std::thread thread_;
};

}  // namespace chunkattn::metrics

#endif  // CHUNKATTN_SERVICES_METRICS_HTTP_SERVER_H_
