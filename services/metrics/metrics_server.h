// The metrics port: Prometheus scrapes and liveness probes, on the HTTP
// server of services/http (its event loop and connection guard):
//   GET /metrics  200, Content-Type: text/plain; version=0.0.4; charset=utf-8,
//                 the body that `render` returns; with tokens, 401 unless the
//                 request carries `Authorization: Bearer <one of them>`
//   GET /healthz  200 "ok\n" (always open: probes carry no token)
//   other paths   404; other methods on those paths 405 (HEAD is served as GET
//                 without the body); a malformed request 400, a head over
//                 16 KiB 431, a request body 413, HTTP/1.0 505
// Connections are kept alive between scrapes.
//
// Idle and slow clients hold a descriptor each, never a thread, and only
// within the guard's bounds: kMaxConnectionsPerPeer from one address
// (kMaxConnections in all; a connection over a cap is closed at once), and
// kTimeout to send a request's head (from the connection's start) or to send
// the next one. So idle connections from other addresses never delay a
// scrape, and a flood of every slot delays it by kTimeout at most.
//
// Thread-safe. `render` is called on the server's loop thread, one scrape at
// a time. The destructor stops the server and joins that thread, so whatever
// `render` uses must outlive the server.
#ifndef CHUNKATTN_SERVICES_METRICS_METRICS_SERVER_H_
#define CHUNKATTN_SERVICES_METRICS_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/http/http_server.h"

namespace chunkattn::metrics {

class MetricsServer {
 public:
  // Scrapers are few (Prometheus replicas, a probe): these are far above
  // their needs and far below the descriptors the coordinator keeps in
  // reserve for everything but its HTTP API.
  static constexpr int kMaxConnections = 256;
  static constexpr int kMaxConnectionsPerPeer = 16;
  static constexpr absl::Duration kTimeout = absl::Seconds(5);

  // Listens on `host`:`port` and serves until destroyed. `host` is an IPv4
  // or IPv6 literal ("0.0.0.0" for every IPv4 interface). `port` 0 picks a
  // free port (see port()). `bearer_tokens` non-empty: /metrics requires one.
  // INVALID_ARGUMENT: host not an IP literal, port outside [0, 65535], no
  // render. UNAVAILABLE: the port cannot be bound (the message says why,
  // e.g. "Address already in use").
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port,
                                                              std::function<std::string()> render,
                                                              std::vector<std::string> bearer_tokens = {});

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  ~MetricsServer();

  // The port actually bound (the chosen one when Start was given 0).
  int port() const { return http_->port(); }

 private:
  MetricsServer(std::function<std::string()> render, std::vector<std::string> bearer_tokens);
  // The answer to a request that must not be served; nullopt: serve it.
  // Called on the loop thread, from the head (before any body) and again for
  // the request itself.
  std::optional<http::Refusal> Check(const http::RequestHead& head) const;
  void Handle(const http::Request& request, http::Reply& reply) const;

  const std::function<std::string()> render_;
  const std::vector<std::string> bearer_tokens_;
  std::unique_ptr<http::HttpServer> http_;  // last: stopped before the members its loop reads
};

}  // namespace chunkattn::metrics

#endif  // CHUNKATTN_SERVICES_METRICS_METRICS_SERVER_H_
