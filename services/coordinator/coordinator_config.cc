// chunkattn-coordinator's flags, and their checks (coordinator_config.h).
#include "services/coordinator/coordinator_config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/fd_limit.h"
#include "base/file.h"
#include "base/redis_client.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "kernels/api/dtype.h"
#include "services/core/policies.h"
#include "services/kv_events/curve.h"
#include "services/kv_events/kv_events.h"
#include "text/tool_calls/tool_parser.h"

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
ABSL_FLAG(std::string, tool_call_parser, "auto",
          "how chat replies become tool_calls with tool_choice auto: auto (from the chat template) | hermes "
          "(Qwen2.5/Qwen3 <tool_call>) | llama3_json | deepseek_v3 | deepseek_v31 (DeepSeek V3.1) | none");
ABSL_FLAG(std::string, reasoning_parser, "auto",
          "how chat replies' thinking becomes reasoning_content: auto (a chat template that writes <think>) | "
          "qwen3 (<think>...</think>) | none");
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
ABSL_FLAG(int64_t, max_retained_chunks_per_tenant, -1,
          "KV retention: the most chunks one tenant's requests may hold above the default priority, in the pool "
          "and the KV tiers together (beyond it a request runs and the rest of its prefix stays at the default); -1 = a quarter of the "
          "pool, 0 = no request may raise a chunk");
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
ABSL_FLAG(std::string, kv_tier_write_policy, "write_back",
          "KV tiers under the pool (the workers' --host_kv_cache_mib, --disk_kv_cache_dir): write_back keeps a "
          "block in a tier when the pool evicts it; write_through as soon as its KV is computed");
ABSL_FLAG(int64_t, kv_tier_max_loads_per_step, 0,
          "the most blocks one step loads back from the KV tiers: a burst of tier hits then comes back over "
          "several steps (each new prompt's prefill waits for its blocks) and slows the running batch's step "
          "less; 0 = no bound");
ABSL_FLAG(std::string, kv_store_url, "",
          "the shared KV tier (issue 41): redis://[[user]:password@]host:port[/db] of a Redis every replica of "
          "this model reaches; handed to the workers at Join. Blocks kept in a tier are written there too, and "
          "a new request's blocks found there are loaded instead of recomputed. A secret (the password): never "
          "logged. Empty = off; rediss:// for TLS (--kv_store_tls_*)");
ABSL_FLAG(std::string, kv_store_url_file, "",
          "--kv_store_url read from this file (one line), so the password is in no argv or environment: the file "
          "must not be readable by others nor writable by its group (600; 440 for a Kubernetes Secret with "
          "fsGroup). Not with --kv_store_url");
ABSL_FLAG(std::string, kv_store_tls_ca_file, "",
          "rediss:// --kv_store_url: PEM CA certificates Redis's certificate must chain to (its name or IP must "
          "be the URL's host); empty = the system's CAs. Handed to the workers at Join");
ABSL_FLAG(std::string, kv_store_tls_cert_file, "",
          "rediss:// --kv_store_url: a PEM client certificate for Redis (its tls-auth-clients, on by default), "
          "with --kv_store_tls_key_file");
ABSL_FLAG(std::string, kv_store_tls_key_file, "",
          "rediss:// --kv_store_url: the client certificate's PEM private key, a secret: the file must not be "
          "readable by others nor writable by its group; handed to the workers at Join, never logged");
ABSL_FLAG(int, mask_threads, 0,
          "threads computing a step's structured-output token masks (while the workers run the step); "
          "0 = a quarter of the CPUs this process may use, 1 to 8");
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

namespace chunkattn {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

bool IsPort(int port) { return port >= 0 && port <= 65535; }

// The KV-event publisher's options, or none when events are off. A replay
// endpoint alone is refused by KvEventPublisher::Create, naming the flag it
// needs.
absl::StatusOr<std::optional<KvEventPublisherOptions>> KvEventOptions(const std::string& served_name) {
  if (!absl::GetFlag(FLAGS_kv_events) && absl::GetFlag(FLAGS_kv_events_endpoint).empty() &&
      absl::GetFlag(FLAGS_kv_events_replay_endpoint).empty()) {
    return std::nullopt;
  }
  KvEventPublisherOptions ko;
  ko.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  ko.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay_endpoint);
  ko.topic = absl::GetFlag(FLAGS_kv_events_topic);
  if (ko.topic.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
    ko.topic = absl::StrCat("kv@", host, "@", served_name);
  }
  absl::StatusOr<KvEventFormat> format = ParseKvEventFormat(absl::GetFlag(FLAGS_kv_events_format));
  if (!format.ok()) return Invalid("--kv_events_format: " + std::string(format.status().message()));
  ko.format = *format;
  ko.buffer_steps = absl::GetFlag(FLAGS_kv_events_buffer_steps);
  ko.allow_plaintext_remote = absl::GetFlag(FLAGS_kv_events_allow_plaintext_remote);
  if (const std::string path = absl::GetFlag(FLAGS_kv_events_curve_secret_key_file); !path.empty()) {
    ASSIGN_OR_RETURN(ko.curve_secret_key, ReadCurveKeyFile(path, "--kv_events_curve_secret_key_file"));
  }
  if (const std::string path = absl::GetFlag(FLAGS_kv_events_curve_client_keys_file); !path.empty()) {
    ASSIGN_OR_RETURN(ko.curve_client_keys, ReadCurveKeysFile(path, "--kv_events_curve_client_keys_file"));
  }
  return ko;
}

// The workers: their addresses, how to reach them and what they load.
absl::Status WorkerOptionsFromFlags(CoordinatorConfig& c) {
  WorkerPoolOptions& w = c.engine.workers;
  w.addresses = absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty());
  if (w.addresses.empty()) return Invalid("--workers is required (host:port,...)");
  for (const std::string& address : w.addresses) RETURN_IF_ERROR(ParseHostPort("--workers", address).status());
  if (absl::GetFlag(FLAGS_join_timeout_s) < 1 || absl::GetFlag(FLAGS_collective_timeout_s) < 1) {
    return Invalid("--join_timeout_s and --collective_timeout_s must be >= 1");
  }
  if (absl::GetFlag(FLAGS_max_kv_chunks) < 0) return Invalid("--max_kv_chunks must be >= 0");
  w.max_kv_chunks = absl::GetFlag(FLAGS_max_kv_chunks);
  w.join_timeout = absl::Seconds(absl::GetFlag(FLAGS_join_timeout_s));
  ASSIGN_OR_RETURN(w.auth, TokenAuth::FromFile(absl::GetFlag(FLAGS_worker_token_file), "--worker_token_file"));
  const TlsClientFiles worker_tls{{"--worker_tls_ca_file", absl::GetFlag(FLAGS_worker_tls_ca_file)},
                                  {"--worker_tls_cert_file", absl::GetFlag(FLAGS_worker_tls_cert_file)},
                                  {"--worker_tls_key_file", absl::GetFlag(FLAGS_worker_tls_key_file)},
                                  absl::GetFlag(FLAGS_worker_tls_server_name)};
  if (!worker_tls.ca.path.empty()) {
    ASSIGN_OR_RETURN(w.channel, MakeChannelSecurity(worker_tls));
    c.worker_tls = true;
    c.worker_mtls = !worker_tls.cert_chain.path.empty();
  } else if (!worker_tls.cert_chain.path.empty() || !worker_tls.private_key.path.empty()) {
    return Invalid("--worker_tls_cert_file and --worker_tls_key_file need --worker_tls_ca_file");
  }
  const double step_timeout = absl::GetFlag(FLAGS_step_timeout_s);
  const double drain_timeout = absl::GetFlag(FLAGS_drain_timeout_s);
  if (!((step_timeout >= 0 || step_timeout == -1) && step_timeout <= 86400) ||
      !(drain_timeout >= 0 && drain_timeout <= 86400)) {
    return Invalid(absl::StrFormat(
        "--step_timeout_s must be -1 (auto) or in [0, 86400] and --drain_timeout_s in [0, 86400], got %g and %g",
        step_timeout, drain_timeout));
  }
  w.adaptive_step_timeout = step_timeout == -1;
  w.step_timeout = step_timeout > 0 ? absl::Seconds(step_timeout) : absl::InfiniteDuration();
  c.drain_timeout = absl::Seconds(drain_timeout);
  const std::string impl = absl::GetFlag(FLAGS_decode_impl);
  if (impl != "tpp" && impl != "seq") return Invalid("--decode_impl must be tpp or seq");
  auto& join = w.join;
  join.set_model(c.model);
  join.set_load_format(c.load_format);
  join.set_dummy_seed(absl::GetFlag(FLAGS_dummy_seed));
  join.set_chunk_size(c.chunk_size);
  join.set_kv_dtype(c.kv_dtype);
  join.set_decode_impl(impl);
  join.set_max_step_tokens(c.engine.scheduler.max_tokens_per_step);
  join.set_max_batch_size(c.engine.scheduler.max_batch_size);
  join.set_collective_timeout_ms(static_cast<uint32_t>(absl::GetFlag(FLAGS_collective_timeout_s)) * 1000);
  return absl::OkStatus();
}

// The scheduler's bounds and the engine's queue.
absl::Status SchedulerOptionsFromFlags(CoordinatorConfig& c) {
  SchedulerOptions& s = c.engine.scheduler;
  s.chunk_size = c.chunk_size;
  s.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  s.tenant_max_batch_share = absl::GetFlag(FLAGS_tenant_max_batch_share);
  s.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  s.prefix_sharing = absl::GetFlag(FLAGS_prefix_sharing);
  if (s.max_batch_size < 1 || s.max_tokens_per_step < s.max_batch_size) {
    return Invalid("--max_batch_size must be >= 1 and --max_tokens_per_step >= --max_batch_size");
  }
  if (!(s.tenant_max_batch_share > 0 && s.tenant_max_batch_share <= 1)) {
    return Invalid("--tenant_max_batch_share must be in (0, 1]");
  }
  const int64_t retained = absl::GetFlag(FLAGS_max_retained_chunks_per_tenant);
  if (retained < -1 || retained > kMaxChunks) {
    return Invalid(absl::StrFormat("--max_retained_chunks_per_tenant must be -1 (a quarter of the pool) or in "
                                   "[0, %d], got %d",
                                   kMaxChunks, retained));
  }
  s.max_retained_chunks_per_tenant = static_cast<int32_t>(retained);
  const double aging = absl::GetFlag(FLAGS_priority_aging_s);
  if (!(aging >= 0 && aging <= absl::ToDoubleSeconds(AdmissionPolicy::kMaxAging))) {
    return Invalid(absl::StrFormat("--priority_aging_s must be in [0, %g], got %g",
                                   absl::ToDoubleSeconds(AdmissionPolicy::kMaxAging), aging));
  }
  s.priority_aging = absl::Seconds(aging);
  c.engine.max_waiting_requests = absl::GetFlag(FLAGS_max_waiting_requests);
  if (c.engine.max_waiting_requests < 0) return Invalid("--max_waiting_requests must be >= 0 (0 = unbounded)");
  c.engine.model_name = c.served_model_name;
  c.engine.kv_events_hash_seed = absl::GetFlag(FLAGS_kv_events_hash_seed);
  ASSIGN_OR_RETURN(c.engine.scheduler.tier_write_through,
                   ParseKvTierWritePolicy(absl::GetFlag(FLAGS_kv_tier_write_policy)));
  const int64_t loads = absl::GetFlag(FLAGS_kv_tier_max_loads_per_step);
  if (loads < 0 || loads > kMaxChunks) {
    return Invalid(absl::StrFormat("--kv_tier_max_loads_per_step must be in [0, %d] (0 = no bound), got %d",
                                   kMaxChunks, loads));
  }
  s.max_tier_loads_per_step = static_cast<int32_t>(loads);
  std::string url = absl::GetFlag(FLAGS_kv_store_url);
  const std::string url_file = absl::GetFlag(FLAGS_kv_store_url_file);
  if (!url_file.empty()) {
    if (!url.empty()) return Invalid("--kv_store_url and --kv_store_url_file are exclusive");
    ASSIGN_OR_RETURN(std::string text, ReadSecretFile("--kv_store_url_file", url_file));
    url = std::string(absl::StripAsciiWhitespace(text));  // a Secret's value often ends with a newline
    if (url.empty() || absl::StrContains(url, '\n')) {
      return Invalid(absl::StrCat("--kv_store_url_file: ", url_file, " must hold one redis:// URL on one line"));
    }
  }
  bool tls = false;  // a rediss:// URL
  if (!url.empty()) {
    absl::StatusOr<RedisUrl> parsed = ParseRedisUrl(url);
    if (!parsed.ok()) {  // never quotes the password
      if (url_file.empty()) return parsed.status();
      return Invalid(absl::StrCat("--kv_store_url_file: ", url_file, ": ",
                                  absl::StripPrefix(parsed.status().message(), "--kv_store_url: ")));
    }
    tls = parsed->tls;
    c.engine.kv_store_url = url;
    c.engine.workers.join.set_kv_store_url(url);
  }
  const std::string ca_file = absl::GetFlag(FLAGS_kv_store_tls_ca_file);
  const std::string cert_file = absl::GetFlag(FLAGS_kv_store_tls_cert_file);
  const std::string key_file = absl::GetFlag(FLAGS_kv_store_tls_key_file);
  if (!tls && !(ca_file.empty() && cert_file.empty() && key_file.empty())) {
    return Invalid("--kv_store_tls_* need a rediss:// --kv_store_url");
  }
  if (tls) {
    RedisTlsOptions& t = c.engine.kv_store_tls;
    if (!ca_file.empty()) {
      ASSIGN_OR_RETURN(t.ca_pem, ReadFileToString(ca_file));
    }
    if (!cert_file.empty()) {
      ASSIGN_OR_RETURN(t.cert_pem, ReadFileToString(cert_file));
    }
    if (!key_file.empty()) {
      ASSIGN_OR_RETURN(t.key_pem, ReadSecretFile("--kv_store_tls_key_file", key_file));
    }
    if (absl::Status s = CheckRedisTlsOptions(t); !s.ok()) {  // never quotes the key
      return Invalid(absl::StrCat("--kv_store_tls_*: ", s.message()));
    }
    c.engine.workers.join.set_kv_store_tls_ca_pem(t.ca_pem);
    c.engine.workers.join.set_kv_store_tls_cert_pem(t.cert_pem);
    c.engine.workers.join.set_kv_store_tls_key_pem(t.key_pem);
  }
  c.engine.mask_threads = absl::GetFlag(FLAGS_mask_threads);
  if (c.engine.mask_threads < 0 || c.engine.mask_threads > 64) return Invalid("--mask_threads must be in [0, 64]");
  if (c.engine.mask_threads == 0) c.engine.mask_threads = std::clamp(AvailableCpus() / 4, 1, 8);
  return absl::OkStatus();
}

}  // namespace

bool CurveKeygenRequested() { return absl::GetFlag(FLAGS_kv_events_curve_keygen); }

absl::StatusOr<CoordinatorConfig> CoordinatorConfigFromFlags() {
  CoordinatorConfig c;
  c.listen = absl::GetFlag(FLAGS_listen);
  ASSIGN_OR_RETURN(c.listen_address, ParseHostPort("--listen", c.listen, 0));
  if (absl::GetFlag(FLAGS_workers).empty()) return Invalid("--workers is required (host:port,...)");
  c.model = absl::GetFlag(FLAGS_model);
  if (c.model.empty()) return Invalid("--model is required");
  c.load_format = absl::GetFlag(FLAGS_load_format);
  if (c.load_format != "auto" && c.load_format != "dummy") return Invalid("--load_format must be auto or dummy");
  c.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  if (c.chunk_size < 16 || c.chunk_size > 256 || (c.chunk_size & (c.chunk_size - 1)) != 0) {
    return Invalid("--chunk_size must be a power of two in [16, 256]");
  }
  c.kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  if (c.kv_dtype != "auto" && !ParseDType(c.kv_dtype)) {
    return Invalid("--kv_dtype must be auto, float32, float16 or bfloat16");
  }
  c.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (!IsPort(c.metrics_port)) return Invalid("--metrics_port must be in [0, 65535]");
  c.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  c.http_port = absl::GetFlag(FLAGS_http_port);
  if (!IsPort(c.http_port)) return Invalid("--http_port must be in [0, 65535]");
  c.http_host = absl::GetFlag(FLAGS_http_host);
  c.served_model_name =
      absl::GetFlag(FLAGS_served_model_name).empty() ? c.model : absl::GetFlag(FLAGS_served_model_name);
  c.health_port = absl::GetFlag(FLAGS_health_port);
  if (!IsPort(c.health_port)) return Invalid("--health_port must be in [0, 65535]");
  c.tls_files = {absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
                 absl::GetFlag(FLAGS_tls_client_ca_file)};
  ASSIGN_OR_RETURN(c.credentials, MakeServerCredentials(c.tls_files));
  ASSIGN_OR_RETURN(c.auth, TokenAuth::FromFile(absl::GetFlag(FLAGS_auth_token_file)));
  if (const std::string path = absl::GetFlag(FLAGS_metrics_token_file); !path.empty()) {
    ASSIGN_OR_RETURN(c.metrics_tokens, ReadTokenFile(path, "--metrics_token_file"));
  }
  RETURN_IF_ERROR(SchedulerOptionsFromFlags(c));
  RETURN_IF_ERROR(WorkerOptionsFromFlags(c));
  ASSIGN_OR_RETURN(c.kv_events, KvEventOptions(c.served_model_name));

  c.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  c.http_max_connections_per_peer = absl::GetFlag(FLAGS_http_max_connections_per_peer);
  c.http_max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes);
  c.http_max_buffered_body_bytes = absl::GetFlag(FLAGS_http_max_buffered_body_bytes);
  c.http_header_timeout_s = absl::GetFlag(FLAGS_http_header_timeout_s);
  c.http_body_timeout_s = absl::GetFlag(FLAGS_http_body_timeout_s);
  c.tool_call_parser = absl::GetFlag(FLAGS_tool_call_parser);
  if (c.tool_call_parser != "auto") {
    if (absl::StatusOr<tools::ToolCallFormat> f = tools::ParseToolCallFormat(c.tool_call_parser); !f.ok()) {
      return Invalid("--tool_call_parser must be auto, hermes, llama3_json, deepseek_v3, deepseek_v31 or none");
    }
  }
  c.reasoning_parser = absl::GetFlag(FLAGS_reasoning_parser);
  if (c.reasoning_parser != "auto" && c.reasoning_parser != "qwen3" && c.reasoning_parser != "none") {
    return Invalid("--reasoning_parser must be auto, qwen3 or none");
  }
  c.max_sequences_per_request = absl::GetFlag(FLAGS_max_sequences_per_request);
  if (c.max_sequences_per_request < 1 || c.max_sequences_per_request > 1 << 16) {
    return Invalid("--max_sequences_per_request must be in [1, 65536]");
  }
  c.tokenize_threads = absl::GetFlag(FLAGS_tokenize_threads);
  if (c.tokenize_threads < 1 || c.tokenize_threads > 64) return Invalid("--tokenize_threads must be in [1, 64]");
  return c;
}

EngineOptions EngineOptionsFor(const CoordinatorConfig& config, const ModelConfig& model,
                               KvEventPublisher* kv_events) {
  EngineOptions options = config.engine;
  options.scheduler.max_context = static_cast<int32_t>(model.max_context);
  options.scheduler.eos_token_ids = model.eos_token_ids;
  options.kv_events = kv_events;
  return options;
}

absl::StatusOr<http::Options> HttpOptionsFor(const CoordinatorConfig& config, int32_t max_context) {
  http::Options o;
  const int64_t fds = RaiseOpenFileLimit();  // a connection per stream
  const int64_t conns = config.http_max_connections;
  const int64_t per_peer = config.http_max_connections_per_peer;
  const int64_t body = config.http_max_body_bytes;
  const int64_t buffered = config.http_max_buffered_body_bytes;
  const double head_s = config.http_header_timeout_s, body_s = config.http_body_timeout_s;
  if (conns < 0 || conns > std::max<int64_t>(16, fds - ReservedDescriptors(fds))) {
    return Invalid(absl::StrFormat(
        "--http_max_connections must be in [0, %d] (0: %d): the descriptor limit is %d, %d kept in reserve",
        std::max<int64_t>(16, fds - ReservedDescriptors(fds)), DefaultHttpConnections(fds), fds,
        ReservedDescriptors(fds)));
  }
  o.max_connections = conns > 0 ? static_cast<int>(conns) : DefaultHttpConnections(fds);
  if (per_peer < 0 || per_peer > o.max_connections) {
    return Invalid("--http_max_connections_per_peer must be in [0, --http_max_connections]");
  }
  o.max_connections_per_peer = per_peer > 0 ? static_cast<int>(per_peer) : std::max(4, o.max_connections / 4);
  if (body != 0 && (body < 1024 || body > (int64_t{1} << 30))) {
    return Invalid("--http_max_body_bytes must be 0 or in [1024, 2^30]");
  }
  // The largest legitimate body: a text prompt of the whole context (32
  // bytes a token at most, 4 MiB in all), twice over for JSON escapes.
  const int64_t text = std::min<int64_t>(int64_t{32} * max_context, 4 << 20);
  o.max_body_bytes =
      static_cast<size_t>(body > 0 ? body : std::clamp<int64_t>(2 * text + (64 << 10), 1 << 20, 16 << 20));
  if (buffered < static_cast<int64_t>(o.max_body_bytes) || buffered > (int64_t{1} << 34)) {
    return Invalid("--http_max_buffered_body_bytes must be in [--http_max_body_bytes, 2^34]");
  }
  o.max_buffered_body_bytes = static_cast<size_t>(buffered);
  if (!(head_s > 0 && head_s <= 3600) || !(body_s > 0 && body_s <= 3600)) {
    return Invalid("--http_header_timeout_s and --http_body_timeout_s must be in (0, 3600]");
  }
  o.header_timeout = absl::Seconds(head_s);
  o.body_timeout = absl::Seconds(body_s);
  o.host = config.http_host;
  o.port = config.http_port;
  o.tls_cert_file = config.tls_files.cert_chain;
  o.tls_key_file = config.tls_files.private_key;
  o.tls_client_ca_file = config.tls_files.client_ca;
  return o;
}

}  // namespace chunkattn
