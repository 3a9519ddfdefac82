#include "services/metrics/metrics_server.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/constant_time.h"

namespace chunkattn::metrics {
namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";

http::Refusal Text(int status, std::string body, std::string extra_header = "") {
  return http::Refusal{status, kTextContentType, std::move(body), std::move(extra_header)};
}

}  // namespace

MetricsServer::MetricsServer(std::function<std::string()> render, std::vector<std::string> bearer_tokens)
    : render_(std::move(render)), bearer_tokens_(std::move(bearer_tokens)) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host, int port,
                                                                   std::function<std::string()> render,
                                                                   std::vector<std::string> bearer_tokens) {
  if (!render) return absl::InvalidArgumentError("metrics server: no render function");
  std::unique_ptr<MetricsServer> server(new MetricsServer(std::move(render), std::move(bearer_tokens)));
  const MetricsServer* raw = server.get();
  http::Options o;
  o.host = host;
  o.port = port;
  // No request here has a body: one is refused from its head (413).
  o.max_body_bytes = 0;
  o.max_buffered_body_bytes = 0;
  o.max_connections = kMaxConnections;
  o.max_connections_per_peer = kMaxConnectionsPerPeer;
  o.header_timeout = kTimeout;
  o.request_timeout = kTimeout;  // the idle time between scrapes on one connection
  o.body_timeout = kTimeout;
  o.reply_timeout = kTimeout;
  o.head_check = [raw](const http::RequestHead& head) { return raw->Check(head); };
  absl::StatusOr<std::unique_ptr<http::HttpServer>> http = http::HttpServer::Start(
      std::move(o), [raw](http::Request request, std::shared_ptr<http::Reply> reply) { raw->Handle(request, *reply); });
  if (!http.ok()) return http.status();
  server->http_ = *std::move(http);
  return server;
}

std::optional<http::Refusal> MetricsServer::Check(const http::RequestHead& head) const {
  if (head.problem != 0 && head.method.empty()) return Text(head.problem, head.problem_message + "\n");  // no request line
  const bool metrics = head.path == "/metrics";
  if (!metrics && head.path != "/healthz") return Text(404, absl::StrCat("Not found: ", head.path, "\n"));
  if (head.method != "GET" && head.method != "HEAD") {
    return Text(405, "Method not allowed\n", "Allow: GET, HEAD");
  }
  if (metrics && !bearer_tokens_.empty()) {
    const absl::string_view presented = BearerCredential(head.authorization);
    bool authorized = false;
    // Every token compared, so the time does not say which one nearly matched.
    for (const std::string& token : bearer_tokens_) authorized |= ConstantTimeEquals(presented, token);
    if (presented.empty() || !authorized) {
      return Text(401, "A bearer token is required\n", "WWW-Authenticate: Bearer");
    }
  }
  if (head.problem != 0) return Text(head.problem, head.problem_message + "\n");
  return std::nullopt;
}

void MetricsServer::Handle(const http::Request& request, http::Reply& reply) const {
  http::RequestHead head;
  head.method = request.method;
  head.path = request.path;
  head.authorization = request.authorization;
  if (std::optional<http::Refusal> refusal = Check(head)) {
    return reply.Send(refusal->status, std::move(refusal->content_type), std::move(refusal->body),
                      std::move(refusal->extra_header));
  }
  if (request.path == "/healthz") return reply.Send(200, kTextContentType, "ok\n");
  reply.Send(200, kMetricsContentType, render_());
}

}  // namespace chunkattn::metrics
