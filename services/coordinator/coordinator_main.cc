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
#include "services/coordinator/engine.h"
#include "services/coordinator/generation_service.h"
#include "services/coordinator/listener_probe.h"
#include "services/coordinator/vllm_engine_service.h"
#include "services/kv_events/curve.h"
#include "base/fd_limit.h"
#include "base/grpc_security.h"
#include "services/metrics/http_server.h"
#include "services/metrics/metrics.h"
#include "services/openai/openai_server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "host:port of the public gRPC API");
ABSL_FLAG(int, metrics_port, 9400, "Prometheus /metrics port; 0 = off");
ABSL_FLAG(int, http_port, 8000,
          "OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health, ...) "
          "on --http_host; same TLS and bearer tokens as --listen; 0 = off");
ABSL_FLAG(std::string, http_host, "0.0.0.0", "address the HTTP API binds (an IP literal)");
ABSL_FLAG(std::string, served_model_name, "", "the model id of the HTTP API (and vllm:* metrics); default: --model");
ABSL_FLAG(int64_t, http_max_body_bytes, 0,
          "largest HTTP request body, refused with 413 from its Content-Length; 0 = twice a text prompt of the "
          "whole context, in [1 MiB, 16 MiB]");
ABSL_FLAG(int64_t, http_max_buffered_body_bytes, 64 << 20,
          "HTTP request bodies being received at once, over every connection; beyond it a request gets 503");
ABSL_FLAG(int64_t, http_max_connections, 0,
          "HTTP connections at once; beyond it a new one is closed at once. 0 = the descriptors left after a reserve "
          "of 256 + a quarter of the limit, at most half (the soft limit is raised to the hard one), at most 16384");
ABSL_FLAG(int64_t, http_max_connections_per_peer, 0,
          "HTTP connections from one address (behind an ingress, its addresses); 0 = a quarter of "
          "--http_max_connections");
ABSL_FLAG(int64_t, max_sequences_per_request, 256,
          "sequences one HTTP completions request may ask for (prompts x n); beyond it 400");
ABSL_FLAG(double, http_header_timeout_s, 10, "seconds a request's head may take in all (from its first byte)");
ABSL_FLAG(double, http_body_timeout_s, 60, "seconds a request's body may take in all (from its head)");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "address the metrics server binds");
ABSL_FLAG(std::string, workers, "", "the compute workers, host:port,... in rank order (required)");
ABSL_FLAG(std::string, model, "", "Hugging Face model folder the workers load (required)");
ABSL_FLAG(std::string, load_format, "auto", "auto (safetensors) | dummy (seeded random weights)");
ABSL_FLAG(uint64_t, dummy_seed, 0, "seed of --load_format dummy weights");
ABSL_FLAG(int, chunk_size, 64, "tokens per KV chunk: a power of two in [16, 256]");
ABSL_FLAG(std::string, kv_dtype, "auto",
          "KV cache dtype: auto (float32 on CPU workers, the model's float16/bfloat16 on GPU) | float32 | "
          "float16 | bfloat16");
ABSL_FLAG(std::string, decode_impl, "tpp", "decode attention: tpp | seq");
ABSL_FLAG(int, max_batch_size, 256, "most sequences in one iteration");
ABSL_FLAG(double, tenant_max_batch_share, 0.5,
          "with bearer tokens, the most of --max_batch_size one tenant's requests may hold, in (0, 1]: the rest "
          "stays free for the other tenants' next requests (1 = no bound)");
ABSL_FLAG(int, max_tokens_per_step, 2048, "most input tokens in one iteration (prefill is chunked to fit)");
ABSL_FLAG(int64_t, max_kv_chunks, 0, "caps the KV pool, chunks; 0 = the smallest worker capacity");
ABSL_FLAG(int64_t, max_waiting_requests, 4096,
          "requests queued beyond which a new one gets RESOURCE_EXHAUSTED at once; 0 = unbounded");
ABSL_FLAG(double, priority_aging_s, 0,
          "seconds of waiting that raise a request by one priority level; 0 = strict priority "
          "(FCFS within a level)");
ABSL_FLAG(bool, prefix_sharing, true, "share KV chunks of common prompt prefixes across requests");
ABSL_FLAG(int, join_timeout_s, 120, "bound on a worker join (weights loading included), seconds");
ABSL_FLAG(int, collective_timeout_s, 30, "bound on the workers' rendezvous and each collective, seconds");
ABSL_FLAG(double, step_timeout_s, -1,
          "a step some worker has not answered in this long fails (a hung worker): the requests in flight end "
          "with UNAVAILABLE, health turns NOT_SERVING and the workers are re-joined; 0 = no bound; -1 (auto) = "
          "20x the slowest of the last 64 steps, within [5 s, 120 s] (60 s for a session's first 8 steps)");
ABSL_FLAG(double, drain_timeout_s, 30,
          "on SIGTERM: readiness turns NOT_SERVING and new requests get UNAVAILABLE at once, running ones "
          "finish for up to this long; 0 = end them at once");
ABSL_FLAG(int, tokenize_threads, 2, "threads that tokenize text prompts, off gRPC's threads");
ABSL_FLAG(int, health_port, 0, "plaintext grpc.health.v1 port on the --listen host, for probes; 0 = off");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM certificate chain: serve the public API over TLS");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "", "PEM CA bundle: require client certificates it signed (mTLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of bearer tokens, one per line: every API call must send 'authorization: Bearer <token>'");
ABSL_FLAG(std::string, metrics_token_file, "",
          "file of bearer tokens, one per line: /metrics requires one (/healthz stays open)");
ABSL_FLAG(std::string, worker_token_file, "",
          "the workers' shared secret (the file their --worker_token_file names): sent on every worker call");
ABSL_FLAG(std::string, worker_tls_ca_file, "",
          "PEM CA the workers' certificates must chain to: call the workers over TLS (plaintext without it)");
ABSL_FLAG(std::string, worker_tls_cert_file, "",
          "PEM client certificate for workers that require one (their --tls_client_ca_file signed it)");
ABSL_FLAG(std::string, worker_tls_key_file, "", "PEM private key of --worker_tls_cert_file");
ABSL_FLAG(bool, kv_events, false,
          "keep KV-cache events (vLLM's format: the cache's full computed chunks as blocks) for "
          "VllmEngine/SubscribeKvEvents; implied by --kv_events_endpoint");
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "ZMQ PUB endpoint of the KV-cache events (every tenant's prompt tokens), as vLLM's kv-events-config "
          "endpoint: a loopback (tcp://127.0.0.1:5556) or wildcard host binds (so do ipc://, inproc://, or an "
          "address with '*' or '::'), any other is connected to; a wildcard host (tcp://*:P, 0.0.0.0, [::]) "
          "needs --kv_events_curve_secret_key_file or --kv_events_allow_plaintext_remote; empty = none");
ABSL_FLAG(std::string, kv_events_replay_endpoint, "",
          "ZMQ ROUTER endpoint (bound) that resends kept event batches from a sequence number, at most 1000 per "
          "request, e.g. tcp://127.0.0.1:5557; a wildcard host as for --kv_events_endpoint");
ABSL_FLAG(bool, kv_events_allow_plaintext_remote, false,
          "let --kv_events_endpoint / --kv_events_replay_endpoint bind a wildcard host without CURVE: anyone who "
          "reaches the ports reads every tenant's prompt tokens (put a NetworkPolicy in front)");
ABSL_FLAG(std::string, kv_events_curve_secret_key_file, "",
          "file holding the KV-event sockets' CURVE secret key (Z85, 40 characters; "
          "--kv_events_curve_keygen makes one): both sockets then speak only CURVE, encrypted, to clients "
          "that know the matching public key");
ABSL_FLAG(std::string, kv_events_curve_client_keys_file, "",
          "file of the CURVE public keys (Z85, one per line) of the clients admitted to the KV-event sockets; "
          "empty = any client that knows the server's public key");
ABSL_FLAG(bool, kv_events_curve_keygen, false,
          "print a new CURVE keypair (public_key=<Z85>, secret_key=<Z85>) for the KV-event sockets or a "
          "client of them, and exit");
ABSL_FLAG(std::string, kv_events_topic, "",
          "first frame of every event message; empty = kv@<hostname>@<served model name> (llm-d's form)");
ABSL_FLAG(std::string, kv_events_format, "map", "event encoding: map (vLLM >= 0.26) | array (older vLLM)");
ABSL_FLAG(int64_t, kv_events_buffer_steps, 10000, "event batches kept for replay, in [1, 1000000]");
ABSL_FLAG(std::string, kv_events_hash_seed, "0",
          "seed of the block hash chain (vLLM's sha256_cbor with PYTHONHASHSEED=<seed>); the same on every "
          "replica");
ABSL_FLAG(std::string, worker_tls_server_name, "chunkattn-worker",
          "the name every worker's certificate must carry, whatever its address in --workers; empty = that "
          "address's host");

namespace {

constexpr const char* kApiServices[] = {"chunkattn.v1.Generation", "vllm.grpc.engine.VllmEngine"};

void SetReady(grpc::HealthCheckServiceInterface* health, bool ready) {
  health->SetServingStatus("", ready);
  for (const char* service : kApiServices) health->SetServingStatus(service, ready);
}

// The HTTP front's guard from the flags (http_server.h): 0 means the
// default, derived from the descriptors the process may open (after raising
// its soft limit) and from the model's context.
absl::Status SetHttpLimits(int32_t max_context, chunkattn::http::Options* o) {
  using namespace chunkattn;
  const int64_t fds = RaiseOpenFileLimit();  // a connection per stream
  const int64_t conns = absl::GetFlag(FLAGS_http_max_connections);
  const int64_t per_peer = absl::GetFlag(FLAGS_http_max_connections_per_peer);
  const int64_t body = absl::GetFlag(FLAGS_http_max_body_bytes);
  const int64_t buffered = absl::GetFlag(FLAGS_http_max_buffered_body_bytes);
  const double head_s = absl::GetFlag(FLAGS_http_header_timeout_s), body_s = absl::GetFlag(FLAGS_http_body_timeout_s);
  if (conns < 0 || conns > std::max<int64_t>(16, fds - ReservedDescriptors(fds))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--http_max_connections must be in [0, %d] (0: %d): the descriptor limit is %d, %d kept in reserve",
        std::max<int64_t>(16, fds - ReservedDescriptors(fds)), DefaultHttpConnections(fds), fds,
        ReservedDescriptors(fds)));
  }
  o->max_connections = conns > 0 ? static_cast<int>(conns) : DefaultHttpConnections(fds);
  if (per_peer < 0 || per_peer > o->max_connections) {
    return absl::InvalidArgumentError("--http_max_connections_per_peer must be in [0, --http_max_connections]");
  }
  o->max_connections_per_peer = per_peer > 0 ? static_cast<int>(per_peer) : std::max(4, o->max_connections / 4);
  if (body != 0 && (body < 1024 || body > (int64_t{1} << 30))) {
    return absl::InvalidArgumentError("--http_max_body_bytes must be 0 or in [1024, 2^30]");
  }
  // The largest legitimate body: a text prompt of the whole context (32
  // bytes a token at most, 4 MiB in all), twice over for JSON escapes.
  const int64_t text = std::min<int64_t>(int64_t{32} * max_context, 4 << 20);
  o->max_body_bytes = static_cast<size_t>(body > 0 ? body : std::clamp<int64_t>(2 * text + (64 << 10), 1 << 20, 16 << 20));
  if (buffered < static_cast<int64_t>(o->max_body_bytes) || buffered > (int64_t{1} << 34)) {
    return absl::InvalidArgumentError("--http_max_buffered_body_bytes must be in [--http_max_body_bytes, 2^34]");
  }
  o->max_buffered_body_bytes = static_cast<size_t>(buffered);
  if (!(head_s > 0 && head_s <= 3600) || !(body_s > 0 && body_s <= 3600)) {
    return absl::InvalidArgumentError("--http_header_timeout_s and --http_body_timeout_s must be in (0, 3600]");
  }
  o->header_timeout = absl::Seconds(head_s);
  o->body_timeout = absl::Seconds(body_s);
  return absl::OkStatus();
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

int Fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace chunkattn;
  NormalizeFlagDashes(argc, argv);
  absl::SetProgramUsageMessage(
      "chunkattn cache coordinator: --workers HOST:PORT,... --model DIR [--listen HOST:PORT] [--metrics_port N]");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_kv_events_curve_keygen)) {
    absl::StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
    if (!pair.ok()) return Fail(std::string(pair.status().message()));
    std::printf("public_key=%s\nsecret_key=%s\n", pair->public_key.c_str(), pair->secret_key.c_str());
    return 0;
  }
  if (!InstallTerminationHandlers()) {
    std::perror("error: signal handlers");
    return 1;
  }

  const std::string listen = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<HostPort> listen_address = ParseHostPort("--listen", listen, 0);
  if (!listen_address.ok()) return Fail(std::string(listen_address.status().message()));
  std::vector<std::string> workers = absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty());
  if (workers.empty()) return Fail("--workers is required (host:port,...)");
  for (const std::string& w : workers) {
    if (absl::Status s = ParseHostPort("--workers", w).status(); !s.ok()) return Fail(std::string(s.message()));
  }
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) return Fail("--model is required");
  const std::string format = absl::GetFlag(FLAGS_load_format);
  if (format != "auto" && format != "dummy") return Fail("--load_format must be auto or dummy");
  const int chunk = absl::GetFlag(FLAGS_chunk_size);
  if (chunk < 16 || chunk > 256 || (chunk & (chunk - 1)) != 0) {
    return Fail("--chunk_size must be a power of two in [16, 256]");
  }
  const std::string kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  if (kv_dtype != "auto" && !ParseDType(kv_dtype)) {
    return Fail("--kv_dtype must be auto, float32, float16 or bfloat16");
  }
  const std::string impl = absl::GetFlag(FLAGS_decode_impl);
  if (impl != "tpp" && impl != "seq") return Fail("--decode_impl must be tpp or seq");
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < 0 || metrics_port > 65535) return Fail("--metrics_port must be in [0, 65535]");
  if (absl::GetFlag(FLAGS_join_timeout_s) < 1 || absl::GetFlag(FLAGS_collective_timeout_s) < 1) {
    return Fail("--join_timeout_s and --collective_timeout_s must be >= 1");
  }
  if (absl::GetFlag(FLAGS_max_kv_chunks) < 0) return Fail("--max_kv_chunks must be >= 0");
  const int http_port = absl::GetFlag(FLAGS_http_port);
  if (http_port < 0 || http_port > 65535) return Fail("--http_port must be in [0, 65535]");
  const std::string served_name =
      absl::GetFlag(FLAGS_served_model_name).empty() ? model : absl::GetFlag(FLAGS_served_model_name);
  const int health_port = absl::GetFlag(FLAGS_health_port);
  if (health_port < 0 || health_port > 65535) return Fail("--health_port must be in [0, 65535]");
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeServerCredentials(
      {absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file), absl::GetFlag(FLAGS_tls_client_ca_file)});
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));
  absl::StatusOr<TokenAuth> auth = TokenAuth::FromFile(absl::GetFlag(FLAGS_auth_token_file));
  if (!auth.ok()) return Fail(std::string(auth.status().message()));
  std::vector<std::string> metrics_tokens;
  if (const std::string path = absl::GetFlag(FLAGS_metrics_token_file); !path.empty()) {
    absl::StatusOr<std::vector<std::string>> tokens = ReadTokenFile(path, "--metrics_token_file");
    if (!tokens.ok()) return Fail(std::string(tokens.status().message()));
    metrics_tokens = *std::move(tokens);
  }
  absl::StatusOr<TokenAuth> worker_auth =
      TokenAuth::FromFile(absl::GetFlag(FLAGS_worker_token_file), "--worker_token_file");
  if (!worker_auth.ok()) return Fail(std::string(worker_auth.status().message()));
  const TlsClientFiles worker_tls{{"--worker_tls_ca_file", absl::GetFlag(FLAGS_worker_tls_ca_file)},
                                  {"--worker_tls_cert_file", absl::GetFlag(FLAGS_worker_tls_cert_file)},
                                  {"--worker_tls_key_file", absl::GetFlag(FLAGS_worker_tls_key_file)},
                                  absl::GetFlag(FLAGS_worker_tls_server_name)};
  ChannelSecurity worker_channel;  // plaintext
  if (!worker_tls.ca.path.empty()) {
    absl::StatusOr<ChannelSecurity> channel = MakeChannelSecurity(worker_tls);
    if (!channel.ok()) return Fail(std::string(channel.status().message()));
    worker_channel = *std::move(channel);
  } else if (!worker_tls.cert_chain.path.empty() || !worker_tls.private_key.path.empty()) {
    return Fail("--worker_tls_cert_file and --worker_tls_key_file need --worker_tls_ca_file");
  }

  std::unique_ptr<KvEventPublisher> kv_events;
  // A replay endpoint alone is refused by Create, naming the flag it needs.
  if (absl::GetFlag(FLAGS_kv_events) || !absl::GetFlag(FLAGS_kv_events_endpoint).empty() ||
      !absl::GetFlag(FLAGS_kv_events_replay_endpoint).empty()) {
    KvEventPublisherOptions ko;
    ko.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
    ko.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay_endpoint);
    ko.topic = absl::GetFlag(FLAGS_kv_events_topic);
    if (ko.topic.empty()) {
      char host[256] = {};
      if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
      ko.topic = absl::StrCat("kv@", host, "@", served_name);
    }
    absl::StatusOr<KvEventFormat> kv_format = ParseKvEventFormat(absl::GetFlag(FLAGS_kv_events_format));
    if (!kv_format.ok()) return Fail("--kv_events_format: " + std::string(kv_format.status().message()));
    ko.format = *kv_format;
    ko.buffer_steps = absl::GetFlag(FLAGS_kv_events_buffer_steps);
    ko.allow_plaintext_remote = absl::GetFlag(FLAGS_kv_events_allow_plaintext_remote);
    if (const std::string path = absl::GetFlag(FLAGS_kv_events_curve_secret_key_file); !path.empty()) {
      absl::StatusOr<std::string> key = ReadCurveKeyFile(path, "--kv_events_curve_secret_key_file");
      if (!key.ok()) return Fail(std::string(key.status().message()));
      ko.curve_secret_key = *std::move(key);
    }
    if (const std::string path = absl::GetFlag(FLAGS_kv_events_curve_client_keys_file); !path.empty()) {
      absl::StatusOr<std::vector<std::string>> keys = ReadCurveKeysFile(path, "--kv_events_curve_client_keys_file");
      if (!keys.ok()) return Fail(std::string(keys.status().message()));
      ko.curve_client_keys = *std::move(keys);
    }
    absl::StatusOr<std::unique_ptr<KvEventPublisher>> p = KvEventPublisher::Create(std::move(ko));
    if (!p.ok()) return Fail(std::string(p.status().message()));
    kv_events = *std::move(p);
  }

  absl::StatusOr<ModelConfig> config = LoadModelConfig(model);
  if (!config.ok()) return Fail("--model: " + config.status().ToString());
  std::unique_ptr<Tokenizer> tokenizer;
  if (absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(model); t.ok()) {
    tokenizer = std::move(*t);
  } else {
    std::fprintf(stderr, "coordinator: no tokenizer (%s): token-id prompts only\n", t.status().ToString().c_str());
  }
  // A template we cannot read disables chat prompts, not the model.
  PromptText prompt_text;
  prompt_text.tokenizer = tokenizer.get();
  std::optional<ModelChatTemplate> chat_template;
  if (absl::StatusOr<ModelChatTemplate> t = LoadChatTemplate(model); t.ok()) {
    chat_template = std::move(*t);
    prompt_text.chat = &*chat_template;
  } else {
    prompt_text.chat_missing = std::string(t.status().message());
    std::fprintf(stderr, "coordinator: no chat prompts (%s)\n", t.status().ToString().c_str());
  }

  EngineOptions options;
  options.scheduler.chunk_size = chunk;
  options.scheduler.max_context = static_cast<int32_t>(config->max_context);
  options.scheduler.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  options.scheduler.tenant_max_batch_share = absl::GetFlag(FLAGS_tenant_max_batch_share);
  options.scheduler.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  options.scheduler.prefix_sharing = absl::GetFlag(FLAGS_prefix_sharing);
  options.scheduler.eos_token_ids = config->eos_token_ids;
  if (options.scheduler.max_batch_size < 1 ||
      options.scheduler.max_tokens_per_step < options.scheduler.max_batch_size) {
    return Fail("--max_batch_size must be >= 1 and --max_tokens_per_step >= --max_batch_size");
  }
  if (!(options.scheduler.tenant_max_batch_share > 0 && options.scheduler.tenant_max_batch_share <= 1)) {
    return Fail("--tenant_max_batch_share must be in (0, 1]");
  }
  const double aging = absl::GetFlag(FLAGS_priority_aging_s);
  if (!(aging >= 0 && aging <= absl::ToDoubleSeconds(AdmissionPolicy::kMaxAging))) {
    return Fail(absl::StrFormat("--priority_aging_s must be in [0, %g], got %g",
                                absl::ToDoubleSeconds(AdmissionPolicy::kMaxAging), aging));
  }
  options.scheduler.priority_aging = absl::Seconds(aging);
  options.max_waiting_requests = absl::GetFlag(FLAGS_max_waiting_requests);
  options.model_name = served_name;
  options.kv_events = kv_events.get();
  options.kv_events_hash_seed = absl::GetFlag(FLAGS_kv_events_hash_seed);
  if (options.max_waiting_requests < 0) return Fail("--max_waiting_requests must be >= 0 (0 = unbounded)");
  options.workers.addresses = workers;
  options.workers.max_kv_chunks = absl::GetFlag(FLAGS_max_kv_chunks);
  options.workers.join_timeout = absl::Seconds(absl::GetFlag(FLAGS_join_timeout_s));
  options.workers.auth = *worker_auth;
  options.workers.channel = worker_channel;
  const double step_timeout = absl::GetFlag(FLAGS_step_timeout_s);
  const double drain_timeout = absl::GetFlag(FLAGS_drain_timeout_s);
  if (!((step_timeout >= 0 || step_timeout == -1) && step_timeout <= 86400) ||
      !(drain_timeout >= 0 && drain_timeout <= 86400)) {
    return Fail(absl::StrFormat(
        "--step_timeout_s must be -1 (auto) or in [0, 86400] and --drain_timeout_s in [0, 86400], got %g and %g",
        step_timeout, drain_timeout));
  }
  options.workers.adaptive_step_timeout = step_timeout == -1;
  options.workers.step_timeout = step_timeout > 0 ? absl::Seconds(step_timeout) : absl::InfiniteDuration();
  auto& join = options.workers.join;
  join.set_model(model);
  join.set_load_format(format);
  join.set_dummy_seed(absl::GetFlag(FLAGS_dummy_seed));
  join.set_chunk_size(chunk);
  join.set_kv_dtype(kv_dtype);
  join.set_decode_impl(impl);
  join.set_max_step_tokens(options.scheduler.max_tokens_per_step);
  join.set_max_batch_size(options.scheduler.max_batch_size);
  join.set_collective_timeout_ms(static_cast<uint32_t>(absl::GetFlag(FLAGS_collective_timeout_s)) * 1000);

  // The HTTP front's limits, checked whether or not it is on.
  http::Options http_limits;
  if (absl::Status s = SetHttpLimits(config->max_context, &http_limits); !s.ok()) return Fail(std::string(s.message()));
  const int64_t max_sequences = absl::GetFlag(FLAGS_max_sequences_per_request);
  if (max_sequences < 1 || max_sequences > 1 << 16) return Fail("--max_sequences_per_request must be in [1, 65536]");

  metrics::Registry registry;
  Engine engine(options, &*config, tokenizer.get(), &registry);
  ServiceInfo info;
  info.model = format == "dummy" ? "dummy:" + model : model;
  info.prefix_sharing = options.scheduler.prefix_sharing;
  info.tensor_parallel_size = static_cast<int>(workers.size());
  info.chunk_size = chunk;
  info.kv_dtype = kv_dtype;
  info.text_threads = absl::GetFlag(FLAGS_tokenize_threads);
  if (info.text_threads < 1 || info.text_threads > 64) return Fail("--tokenize_threads must be in [1, 64]");
  // Text prompts of both fronts are tokenized here, under one bound.
  auto text_pool = std::make_unique<TextPool>(info.text_threads, kMaxQueuedTexts);
  GenerationService service(&engine, &*config, prompt_text, info, &*auth, text_pool.get());
  VllmServiceInfo vllm_info;
  vllm_info.model_path = model;
  vllm_info.served_model_name = served_name;
  vllm_info.version = CHUNKATTN_VERSION;
  vllm_info.chunk_size = chunk;
  vllm_info.max_running_requests = options.scheduler.max_batch_size;
  VllmEngineService vllm_service(&engine, &*config, prompt_text, vllm_info, &*auth, text_pool.get(), kv_events.get());

  std::unique_ptr<openai::OpenAiServer> openai_server;
  std::atomic<const openai::OpenAiServer*> http_front{nullptr};  // for the scrapes, once started
  // /metrics on both the HTTP front and the metrics port.
  auto render_metrics = [&registry, &http_front] {
    PublishHttpStats(http_front.load(), registry);
    return registry.Serialize();
  };
  if (http_port > 0) {
    openai::ServerOptions http;
    http.http = http_limits;
    http.http.host = absl::GetFlag(FLAGS_http_host);
    http.http.port = http_port;
    http.http.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
    http.http.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
    http.http.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
    http.model = {served_name, config->max_context, max_sequences};
    http.version = CHUNKATTN_VERSION;
    http.metrics_tokens = metrics_tokens;
    absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> started = openai::OpenAiServer::Start(
        std::move(http), &engine, &*config, prompt_text, text_pool.get(), &*auth, render_metrics);
    if (!started.ok()) return Fail("--http_port: " + started.status().ToString());
    openai_server = std::move(*started);
    http_front = openai_server.get();
  }

  std::unique_ptr<metrics::MetricsHttpServer> http;
  if (metrics_port > 0) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> started = metrics::MetricsHttpServer::Start(
        absl::GetFlag(FLAGS_metrics_host), metrics_port, render_metrics, metrics_tokens);
    if (!started.ok()) return Fail("--metrics_port: " + started.status().ToString());
    http = std::move(*started);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ConfigureServer(builder);
  int bound = 0;
  builder.AddListeningPort(listen, *credentials, &bound);
  builder.RegisterService(&service);
  builder.RegisterService(&vllm_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound == 0) return Fail("cannot listen on " + listen);
  std::vector<grpc::HealthCheckServiceInterface*> healths = {server->GetHealthCheckService()};
  std::unique_ptr<grpc::Server> health_server;
  if (health_port > 0) {
    const std::string health_address = absl::StrCat(listen_address->host, ":", health_port);
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
  // A plaintext API port is probed from inside (listener_probe.h): should its
  // listener stop accepting, liveness turns NOT_SERVING and the pod restarts.
  // (A probe of a TLS port would log a failed handshake every few seconds;
  // there the HTTP front's caps are what keep descriptors in reserve.)
  std::unique_ptr<ListenerProbe> listener_probe;
  if (absl::GetFlag(FLAGS_tls_cert_file).empty()) {
    ListenerProbeOptions probe;
    probe.host = listen_address->host;
    probe.port = bound;
    listener_probe = std::make_unique<ListenerProbe>(probe, [healths] {
      for (grpc::HealthCheckServiceInterface* health : healths) health->SetServingStatus("liveness", false);
    });
  }
  // Once draining, readiness stays NOT_SERVING whatever the workers do.
  std::atomic<bool> draining{false};
  engine.SetReadyCallback([healths, &draining](bool ready) {
    for (grpc::HealthCheckServiceInterface* health : healths) SetReady(health, ready && !draining);
  });
  engine.Start();
  std::fprintf(stderr,
               "chunkattn-coordinator listening on %s (%s%s, health %s, metrics %s, OpenAI HTTP %s), %zu "
               "worker(s)%s, model %s\n",
               listen.c_str(), absl::GetFlag(FLAGS_tls_cert_file).empty() ? "plaintext" : "TLS",
               auth->enabled() ? ", bearer tokens" : "",
               health_port > 0 ? absl::StrCat(":", health_port).c_str() : "on the API port",
               metrics_port > 0 ? absl::StrCat(":", metrics_port).c_str() : "off",
               openai_server ? absl::StrCat(absl::GetFlag(FLAGS_http_host), ":", openai_server->port()).c_str() : "off",
               workers.size(),
               worker_tls.ca.path.empty()           ? " in plaintext"
               : worker_tls.cert_chain.path.empty() ? " over TLS"
                                                    : " over mutual TLS",
               model.c_str());

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
  chunkattn::WaitForTerminationSignal();  // this thread, not a handler, shuts down
  // Drain: out of the load balancer's rotation at once (readiness), new
  // requests refused, running ones finished within the bound.
  draining = true;
  for (grpc::HealthCheckServiceInterface* health : healths) SetReady(health, false);
  if (openai_server) openai_server->SetDraining();
  std::fprintf(stderr, "coordinator: draining (up to %g s)\n", drain_timeout);
  const bool drained = engine.Drain(absl::Seconds(drain_timeout));
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
  http.reset();  // the scrapes read the HTTP front's figures
  http_front = nullptr;
  openai_server.reset();
  vllm_service.Shutdown();  // its event subscriptions, which the server would wait for
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
