// The OpenAI-compatible HTTP front: the same Engine (scheduler, cache,
// limits, metrics) as the gRPC API, reached the way routers, benchmarks and
// OpenAI's SDKs reach vLLM.
//
//   POST /v1/completions, /v1/chat/completions  (stream: Server-Sent Events)
//   GET  /v1/models, /v1/models/{id}
//   POST /tokenize, /detokenize                 (vLLM's shapes)
//   GET  /health   200 when the workers are ready and not draining, else 503 (no token)
//   GET  /version  (no token)
//   GET  /metrics  the Prometheus text (the metrics tokens, if any)
//
// A request's route, method and credentials are checked from its head,
// before its body is read: an unauthenticated client gets its 401 without
// the server buffering a byte of its body (http_server.h, the guard).
// Bodies are parsed, checked and tokenized on the coordinator's text pool,
// never on the HTTP loop; a client that disconnects cancels its requests
// (their chunks are freed). With bearer tokens every /v1 call, /tokenize and
// /detokenize need one, and a request's cache namespace is its tenant's
// (base/tenant_namespace.h) whatever cache_salt it sends.
//
// Thread-safe. Everything passed in is borrowed and must outlive the server.
#ifndef CHUNKATTN_SERVICES_FRONTS_OPENAI_OPENAI_SERVER_H_
#define CHUNKATTN_SERVICES_FRONTS_OPENAI_OPENAI_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/grpc_security.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/input_processor.h"
#include "services/coordinator/text_pool.h"
#include "services/http/http_server.h"
#include "services/fronts/openai/openai_protocol.h"

namespace chunkattn::openai {

struct ServerOptions {
  http::Options http;
  ServedModel model;
  std::string version;                      // what /version reports
  std::vector<std::string> metrics_tokens;  // empty: /metrics is open
};

class OpenAiServer {
 public:
  // `render_metrics` gives /metrics' body (called on the HTTP loop).
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(ServerOptions options, Engine* engine,
                                                             const ModelConfig* config, PromptText text,
                                                             TextPool* text_pool, const TokenAuth* auth,
                                                             std::function<std::string()> render_metrics);
  ~OpenAiServer();

  int port() const { return http_->port(); }
  http::HttpServer::Stats http_stats() const { return http_->stats(); }
  // Graceful shutdown: /health answers 503 from now on, so load balancers
  // and endpoint pickers stop sending (requests still get served).
  void SetDraining() { draining_ = true; }

 private:
  OpenAiServer(ServerOptions options, Engine* engine, const ModelConfig* config, PromptText text,
               TextPool* text_pool, const TokenAuth* auth, std::function<std::string()> render_metrics);
  // Routing, method and credentials from a request's head alone: a refusal,
  // or nullopt with `caller` set. The HTTP loop runs it on every head before
  // the body is read (CheckHead) and again on the whole request (Handle).
  std::optional<http::Refusal> Gate(const std::string& method, const std::string& path,
                                    const std::string& authorization, Caller* caller) const;
  std::optional<http::Refusal> CheckHead(const http::RequestHead& head) const;
  // The HTTP loop's handler: routing, auth and the cheap endpoints.
  void Handle(http::Request request, std::shared_ptr<http::Reply> reply);
  // On the text pool: parse, check, tokenize, submit.
  void Generate(Endpoint endpoint, const http::Request& request, const std::string& tenant,
                const std::shared_ptr<http::Reply>& reply);
  void Tokenize(const http::Request& request, const std::shared_ptr<http::Reply>& reply);
  void Detokenize(const http::Request& request, const std::shared_ptr<http::Reply>& reply);

  const ServerOptions options_;
  Engine* const engine_;
  const ModelConfig* const config_;
  const PromptText text_;
  TextPool* const text_pool_;
  const TokenAuth* const auth_;
  const std::function<std::string()> render_metrics_;
  const int64_t created_;  // /v1/models' "created": the server's start
  std::atomic<bool> draining_{false};
  std::unique_ptr<http::HttpServer> http_;  // last: stopped first
};

}  // namespace chunkattn::openai

#endif  // CHUNKATTN_SERVICES_FRONTS_OPENAI_OPENAI_SERVER_H_
