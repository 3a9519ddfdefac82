// chunkattn-coordinator: the cache coordinator. Serves chunkattn.v1.Generation
// (plus grpc.health.v1.Health and server reflection), owns the prefix forest
// and the scheduler, drives the tensor-parallel workers given by --workers
// (plaintext, or TLS / mutual TLS with --worker_tls_*), and exports
// Prometheus metrics on --metrics_port.
//
// Health: service "" (and "chunkattn.v1.Generation") is SERVING once every
// worker has joined, for readiness probes; "liveness" is SERVING while the
// process runs, so a coordinator waiting for its workers is not restarted.
// --health_port serves the same statuses in plaintext, for Kubernetes' gRPC
// probes, which cannot speak TLS.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_split.h"
#include "base/address.h"
#include "base/flags.h"
#include "base/grpc_server.h"
#include "base/signals.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "kernels/api/dtype.h"
#include "services/coordinator/coordinator_config.h"
#include "services/coordinator/engine.h"
#include "services/fronts/grpc/generation_service.h"
#include "services/coordinator/listener_probe.h"
#include "services/fronts/vllm/vllm_service.h"
#include "services/kv_events/curve.h"
#include "base/fd_limit.h"
#include "base/grpc_security.h"
#include "services/metrics/metrics.h"
#include "services/metrics/metrics_server.h"
#include "services/fronts/openai/openai_server.h"

namespace {

constexpr const char* kApiServices[] = {"chunkattn.v1.Generation", "vllm.grpc.engine.VllmEngine"};

void SetReady(grpc::HealthCheckServiceInterface* health, bool ready) {
  health->SetServingStatus("", ready);
  for (const char* service : kApiServices) health->SetServingStatus(service, ready);
}

// The HTTP front's guard, as metrics (at each scrape; nothing when it is off).
// Scrapes come from two servers' threads: one at a time, so that a total is
// never raised twice by the same difference.
void PublishHttpStats(const chunkattn::openai::OpenAiServer* server, chunkattn::metrics::Registry& r) {
  if (server == nullptr) return;
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  const chunkattn::http::HttpServer::Stats s = server->http_stats();
  r.GetGauge("chunkattn_http_connections", "Open connections to the HTTP API.").Set(static_cast<double>(s.open_connections));
  const std::pair<const char*, int64_t> totals[] = {
      {"refused_connection", s.refused_connections}, {"refused_request", s.refused_heads},
      {"deadline", s.deadlines}, {"accept_error", s.accept_errors}};
  for (const auto& [what, n] : totals) {
    chunkattn::metrics::Counter& c = r.GetCounter(
        "chunkattn_http_guard_events_total",
        "HTTP connections closed over a cap, requests refused from their head, connections cut at a deadline, "
        "and accept() failures.",
        {{"event", what}});
    c.Increment(static_cast<double>(n) - c.value());
  }
}

// The structured-output compile cache's figures, at each scrape.
void PublishGrammarStats(const chunkattn::grammar::CompileCache& cache, chunkattn::metrics::Registry& r) {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  r.GetGauge("chunkattn_grammar_cache_entries", "Compiled structured-output constraints cached (per tenant).")
      .Set(static_cast<double>(cache.size()));
  r.GetGauge("chunkattn_grammar_cache_bytes", "Approximate memory the cached compiled constraints hold.")
      .Set(static_cast<double>(cache.bytes()));
  const std::pair<const char*, int64_t> lookups[] = {{"hit", cache.hits()}, {"miss", cache.misses()}};
  for (const auto& [what, n] : lookups) {
    chunkattn::metrics::Counter& c = r.GetCounter(
        "chunkattn_grammar_compiles_total",
        "Structured-output constraints looked up: found compiled (hit) or compiled (miss, refusals included).",
        {{"result", what}});
    c.Increment(static_cast<double>(n) - c.value());
  }
}

// What the coordinator serves where, once it does (stderr).
void LogStarted(const chunkattn::CoordinatorConfig& c, const chunkattn::openai::OpenAiServer* http,
                const chunkattn::KvEventPublisher* kv_events) {
  using namespace chunkattn;
  std::fprintf(stderr,
               "chunkattn-coordinator listening on %s (%s%s, health %s, metrics %s, OpenAI HTTP %s), %zu "
               "worker(s)%s, model %s\n",
               c.listen.c_str(), c.tls() ? "TLS" : "plaintext",
               c.auth.enabled() ? ", bearer tokens" : "",
               c.health_port > 0 ? absl::StrCat(":", c.health_port).c_str() : "on the API port",
               c.metrics_port > 0 ? absl::StrCat(":", c.metrics_port).c_str() : "off",
               http != nullptr ? absl::StrCat(c.http_host, ":", http->port()).c_str() : "off",
               c.engine.workers.addresses.size(),
               !c.worker_tls ? " in plaintext" : !c.worker_mtls ? " over TLS" : " over mutual TLS",
               c.model.c_str());

  if (kv_events != nullptr) {
    const KvEventPublisherOptions& ko = kv_events->options();
    std::string where = "in process only";
    if (!kv_events->bound_endpoint().empty()) where = "on " + kv_events->bound_endpoint();
    if (!kv_events->bound_replay_endpoint().empty()) where += ", replay on " + kv_events->bound_replay_endpoint();
    std::string security;
    if (!kv_events->bound_endpoint().empty() && ko.curve_secret_key.empty()) {
      security = ", plaintext";
    } else if (!kv_events->bound_endpoint().empty()) {
      // The public key is what the routers need (their CURVE server key).
      absl::StatusOr<std::string> public_key = CurvePublicKey(ko.curve_secret_key);
      security = absl::StrCat(", CURVE (server public key ", public_key.ok() ? *public_key : "?", ", ",
                              ko.curve_client_keys.empty() ? std::string("any client")
                                                           : absl::StrCat("client keys: ", ko.curve_client_keys.size()),
                              ")");
    }
    std::fprintf(stderr, "coordinator: KV events %s, topic %s%s\n", where.c_str(), ko.topic.c_str(),
                 security.c_str());
  }
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 2;
}

// How the HTTP front reads chat replies: the flags, or (auto) what the chat
// template shows the model was trained to write.
chunkattn::openai::OutputFormat OutputFormatFor(const chunkattn::CoordinatorConfig& c,
                                                const std::string& chat_template) {
  namespace tools = chunkattn::tools;
  chunkattn::openai::OutputFormat out;
  out.tool_calls = c.tool_call_parser == "auto" ? tools::DetectToolCallFormat(chat_template)
                                                : tools::ParseToolCallFormat(c.tool_call_parser).value();
  out.reasoning = c.reasoning_parser == "qwen3" ||
                  (c.reasoning_parser == "auto" && chat_template.find("<think>") != std::string::npos);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace chunkattn;
  NormalizeFlagDashes(argc, argv);
  absl::SetProgramUsageMessage(
      "chunkattn cache coordinator: --workers HOST:PORT,... --model DIR [--listen HOST:PORT] [--metrics_port N]");
  absl::ParseCommandLine(argc, argv);
  if (CurveKeygenRequested()) {
    absl::StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
    if (!pair.ok()) return Fail(std::string(pair.status().message()));
    std::printf("public_key=%s\nsecret_key=%s\n", pair->public_key.c_str(), pair->secret_key.c_str());
    return 0;
  }
  if (!InstallTerminationHandlers()) {
    std::perror("error: signal handlers");
    return 1;
  }
  absl::StatusOr<CoordinatorConfig> flags = CoordinatorConfigFromFlags();
  if (!flags.ok()) return Fail(std::string(flags.status().message()));
  const CoordinatorConfig& c = *flags;

  std::unique_ptr<KvEventPublisher> kv_events;
  if (c.kv_events) {
    absl::StatusOr<std::unique_ptr<KvEventPublisher>> p = KvEventPublisher::Create(*c.kv_events);
    if (!p.ok()) return Fail(std::string(p.status().message()));
    kv_events = *std::move(p);
  }

  absl::StatusOr<ModelConfig> config = LoadModelConfig(c.model);
  if (!config.ok()) return Fail("--model: " + config.status().ToString());
  std::unique_ptr<Tokenizer> tokenizer;
  if (absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(c.model); t.ok()) {
    tokenizer = std::move(*t);
  } else {
    std::fprintf(stderr, "coordinator: no tokenizer (%s): token-id prompts only\n", t.status().ToString().c_str());
  }
  // A template we cannot read disables chat prompts, not the model.
  PromptText prompt_text;
  prompt_text.tokenizer = tokenizer.get();
  std::optional<ModelChatTemplate> chat_template;
  if (absl::StatusOr<ModelChatTemplate> t = LoadChatTemplate(c.model); t.ok()) {
    chat_template = std::move(*t);
    prompt_text.chat = &*chat_template;
  } else {
    prompt_text.chat_missing = std::string(t.status().message());
    std::fprintf(stderr, "coordinator: no chat prompts (%s)\n", t.status().ToString().c_str());
  }
  // Structured outputs: constraints compile against the tokenizer's
  // vocabulary, whose stop tokens are the model's EOS.
  grammar::CompileCache grammars(grammar::CompileCache::Options{});
  StructuredOutputs structured;
  if (tokenizer != nullptr && tokenizer->vocab_size() > config->vocab_size) {
    // A mask could then allow only tokens the model has no logit for, and
    // the workers would refuse the whole step.
    std::fprintf(stderr, "coordinator: no structured outputs: the tokenizer has %d tokens, the model %d\n",
                 tokenizer->vocab_size(), config->vocab_size);
  } else if (tokenizer != nullptr) {
    absl::StatusOr<std::shared_ptr<const grammar::Vocabulary>> vocab =
        grammar::Vocabulary::Create(*tokenizer, config->eos_token_ids);
    if (vocab.ok()) {
      structured = {*std::move(vocab), &grammars};
      prompt_text.structured = &structured;
    } else {
      std::fprintf(stderr, "coordinator: no structured outputs (%s)\n", vocab.status().ToString().c_str());
    }
  }
  const EngineOptions options = EngineOptionsFor(c, *config, kv_events.get());
  // The HTTP front's limits, checked whether or not it is on.
  absl::StatusOr<http::Options> http_options = HttpOptionsFor(c, config->max_context);
  if (!http_options.ok()) return Fail(std::string(http_options.status().message()));

  metrics::Registry registry;
  Engine engine(options, &*config, tokenizer.get(), &registry);
  ServiceInfo info;
  info.model = c.load_format == "dummy" ? "dummy:" + c.model : c.model;
  info.prefix_sharing = options.scheduler.prefix_sharing;
  info.tensor_parallel_size = static_cast<int>(c.engine.workers.addresses.size());
  info.chunk_size = c.chunk_size;
  info.kv_dtype = c.kv_dtype;
  info.text_threads = c.tokenize_threads;
  // Text prompts of both fronts are tokenized here, under one bound.
  auto text_pool = std::make_unique<TextPool>(info.text_threads, kMaxQueuedTexts);
  GenerationService service(&engine, &*config, prompt_text, info, &c.auth, text_pool.get());
  VllmServiceInfo vllm_info;
  vllm_info.model_path = c.model;
  vllm_info.served_model_name = c.served_model_name;
  vllm_info.version = CHUNKATTN_VERSION;
  vllm_info.chunk_size = c.chunk_size;
  vllm_info.max_running_requests = options.scheduler.max_batch_size;
  VllmService vllm_service(&engine, &*config, prompt_text, vllm_info, &c.auth, text_pool.get(), kv_events.get());

  std::unique_ptr<openai::OpenAiServer> openai_server;
  std::atomic<const openai::OpenAiServer*> http_front{nullptr};  // for the scrapes, once started
  // /metrics on both the HTTP front and the metrics port.
  auto render_metrics = [&registry, &http_front, &grammars] {
    PublishHttpStats(http_front.load(), registry);
    PublishGrammarStats(grammars, registry);
    return registry.Serialize();
  };
  if (c.http_port > 0) {
    openai::ServerOptions http;
    http.http = *http_options;
    http.model = {c.served_model_name, config->max_context, c.max_sequences_per_request,
                  OutputFormatFor(c, chat_template ? chat_template->source : std::string())};
    http.version = CHUNKATTN_VERSION;
    http.metrics_tokens = c.metrics_tokens;
    absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> started = openai::OpenAiServer::Start(
        std::move(http), &engine, &*config, prompt_text, text_pool.get(), &c.auth, render_metrics);
    if (!started.ok()) return Fail("--http_port: " + started.status().ToString());
    openai_server = std::move(*started);
    http_front = openai_server.get();
  }

  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (c.metrics_port > 0) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> started = metrics::MetricsServer::Start(
        c.metrics_host, c.metrics_port, render_metrics, c.metrics_tokens);
    if (!started.ok()) return Fail("--metrics_port: " + started.status().ToString());
    metrics_server = std::move(*started);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ConfigureServer(builder);
  int bound = 0;
  builder.AddListeningPort(c.listen, c.credentials, &bound);
  builder.RegisterService(&service);
  builder.RegisterService(&vllm_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound == 0) return Fail("cannot listen on " + c.listen);
  std::vector<grpc::HealthCheckServiceInterface*> healths = {server->GetHealthCheckService()};
  std::unique_ptr<grpc::Server> health_server;
  if (c.health_port > 0) {
    const std::string health_address = absl::StrCat(c.listen_address.host, ":", c.health_port);
    grpc::ServerBuilder health_builder;
    ConfigureServer(health_builder);
    int health_bound = 0;
    health_builder.AddListeningPort(health_address, grpc::InsecureServerCredentials(), &health_bound);
    health_server = health_builder.BuildAndStart();
    if (health_server == nullptr || health_bound == 0) return Fail("cannot listen on " + health_address);
    healths.push_back(health_server->GetHealthCheckService());
  }
  for (grpc::HealthCheckServiceInterface* health : healths) {
    SetReady(health, false);
    health->SetServingStatus("liveness", true);
  }
  // The API port is probed from inside (listener_probe.h), in plaintext or
  // TLS as it serves: should its listener stop accepting, liveness turns
  // NOT_SERVING and the pod restarts.
  ListenerProbeOptions probe;
  probe.host = c.listen_address.host;
  probe.port = bound;
  probe.tls = c.tls();
  auto listener_probe = std::make_unique<ListenerProbe>(probe, [healths] {
    for (grpc::HealthCheckServiceInterface* health : healths) health->SetServingStatus("liveness", false);
  });
  // Once draining, readiness stays NOT_SERVING whatever the workers do.
  std::atomic<bool> draining{false};
  engine.SetReadyCallback([healths, &draining](bool ready) {
    for (grpc::HealthCheckServiceInterface* health : healths) SetReady(health, ready && !draining);
  });
  engine.Start();
  LogStarted(c, openai_server.get(), kv_events.get());
  chunkattn::WaitForTerminationSignal();  // this thread, not a handler, shuts down
  // Drain: out of the load balancer's rotation at once (readiness), new
  // requests refused, running ones finished within the bound.
  draining = true;
  for (grpc::HealthCheckServiceInterface* health : healths) SetReady(health, false);
  if (openai_server) openai_server->SetDraining();
  std::fprintf(stderr, "coordinator: draining (up to %g s)\n", absl::ToDoubleSeconds(c.drain_timeout));
  const bool drained = engine.Drain(c.drain_timeout);
  std::fprintf(stderr, "coordinator: %s; shutting down\n",
               drained ? "drained" : "drain timeout: ending the requests still running");
  listener_probe.reset();  // before the health services it reports to
  for (grpc::HealthCheckServiceInterface* health : healths) health->Shutdown();
  // The engine first: it ends every stream (so the server's shutdown does not
  // wait on them) and makes its last ready callback while `health` lives.
  engine.Stop();
  // Then the text still queued (its requests are refused by the stopped
  // engine), before the fronts whose tasks it runs.
  text_pool.reset();
  metrics_server.reset();  // the scrapes read the HTTP front's figures
  http_front = nullptr;
  openai_server.reset();
  vllm_service.Shutdown();  // its event subscriptions, which the server would wait for
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
