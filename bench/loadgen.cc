// chunkattn-loadgen: open-loop load against a running coordinator, with the
// ChunkAttention paper's end-to-end metrics (section 4.3, Table 4).
//
// `requests` requests arrive as a Poisson process of `rate` per second. Each
// prompt has n_p token ids: the first n_s are the same for every request (a
// shared system prompt), the rest random per request; each asks for exactly
// n_c completion tokens (greedy, ignore_eos). Reported:
//   normalized latency  mean over requests of latency / completion tokens (ms/token)
//   throughput          completion tokens / (last finish - first arrival)
//   TTFT, inter-token   p50 / p99 over requests / over token gaps (client-side)
//   peak KV             the coordinator's peak used chunks x bytes per chunk, and
//                       what the same sequences would have needed unshared
//   peak batch          the most running requests seen by polling every 20 ms
// The KV peaks are this run's: it resets the coordinator's peaks first (but
// prompts cached by earlier runs stay cached; use a fresh --seed or
// --cache_namespace per run).
//
// The requests go through either front of the same engine: the gRPC API
// (default) or, with --http, the OpenAI-compatible HTTP API as a streamed
// /v1/completions with the prompt as token ids (vLLM's return_token_ids gives
// the exact tokens of each chunk). --server still answers the model and cache
// figures, so the two fronts' runs compare column for column; the JSON's
// completion_digest is equal when both returned the same tokens. A bearer
// token, when the server wants one, comes from $CHUNKATTN_AUTH_TOKEN.
//
//   chunkattn-loadgen --server 127.0.0.1:50051 --rate 2 --requests 64 --np 1024 --ns 512 --nc 64 --json out.json
//   chunkattn-loadgen --server 127.0.0.1:50051 --http http://127.0.0.1:8000 ... (the same, over HTTP)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "chunkattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "services/client/client.h"
#include "services/http/http_client.h"

ABSL_FLAG(std::string, server, "", "the coordinator, HOST:PORT");
ABSL_FLAG(double, rate, 1.0, "mean arrivals per second (Poisson)");
ABSL_FLAG(int, requests, 32, "requests to send");
ABSL_FLAG(int, np, 1024, "prompt tokens per request (n_p)");
ABSL_FLAG(int, ns, 512, "leading prompt tokens shared by every request (n_s <= n_p)");
ABSL_FLAG(int, nc, 64, "completion tokens per request (n_c); EOS is ignored");
ABSL_FLAG(uint64_t, seed, 1, "seed of the prompts and the arrival times");
ABSL_FLAG(std::string, cache_namespace, "", "cache namespace of every request");
ABSL_FLAG(double, timeout_s, 3600, "deadline of every request, seconds");
ABSL_FLAG(std::string, json, "", "write the result (one JSON object) here");
ABSL_FLAG(std::string, http, "",
          "send the requests to the OpenAI-compatible HTTP API at this base URL (http://HOST:PORT) instead of "
          "gRPC; --server still gives the model and the cache figures");

namespace chunkattn {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Outcome {
  bool ok = false;
  std::string error;
  double latency_s = 0, ttft_s = 0;
  std::vector<double> gaps_s;      // between consecutive streamed tokens
  std::vector<int32_t> tokens;     // the completion
  int cached_prompt_tokens = 0;
  Clock::time_point finished;
};

// Times the tokens of one request as they stream in, whichever the front.
class Timeline {
 public:
  explicit Timeline(Outcome* out) : out_(out), start_(Clock::now()), last_(start_) {}
  template <typename Ids>
  void Tokens(const Ids& ids) {
    if (ids.empty()) return;
    const Clock::time_point now = Clock::now();
    if (out_->tokens.empty()) {
      out_->ttft_s = Seconds(start_, now);
    } else {
      out_->gaps_s.push_back(Seconds(last_, now) / ids.size());
    }
    out_->tokens.insert(out_->tokens.end(), ids.begin(), ids.end());
    last_ = now;
  }
  // `error` empty: the server ended the request normally.
  void Finish(bool finished, int nc, std::string error) {
    out_->finished = Clock::now();
    out_->latency_s = Seconds(start_, out_->finished);
    const int got = static_cast<int>(out_->tokens.size());
    out_->ok = error.empty() && finished && got == nc;
    if (!out_->ok) {
      out_->error = !error.empty() ? std::move(error) : absl::StrFormat("finished with %d of %d tokens", got, nc);
    }
  }

 private:
  Outcome* out_;
  const Clock::time_point start_;
  Clock::time_point last_;
};

struct Workload {
  int nc = 0;
  double timeout_s = 0;
  std::string cache_namespace;
  std::string auth_token;
};

void RunGrpc(v1::Generation::Stub* stub, const Workload& w, const std::vector<int32_t>& prompt, int i,
             Outcome* out) {
  v1::GenerateRequest request;
  request.set_request_id(absl::StrFormat("loadgen-%d", i));
  for (int32_t id : prompt) request.mutable_token_ids()->add_ids(id);
  request.set_cache_namespace(w.cache_namespace);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_stopping()->set_max_new_tokens(w.nc);
  request.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  client::SetDeadline(&ctx, w.timeout_s);
  Timeline timeline(out);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&ctx, request);
  v1::GenerateResponse response;
  bool finished = false;
  while (reader->Read(&response)) {
    timeline.Tokens(response.token_ids());
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      finished = true;
      out->cached_prompt_tokens = static_cast<int>(response.usage().cached_prompt_tokens());
    }
  }
  const grpc::Status status = reader->Finish();
  timeline.Finish(finished, w.nc,
                  status.ok() ? "" : absl::StrFormat("%d: %s", static_cast<int>(status.error_code()), status.error_message()));
}

// The same request as a streamed /v1/completions: greedy, ignore_eos, the
// prompt as token ids, the cache namespace as vLLM's cache_salt.
void RunHttp(const http::BaseUrl& base, const std::string& model, const Workload& w,
             const std::vector<int32_t>& prompt, int i, Outcome* out) {
  nlohmann::json body = {{"model", model},
                         {"prompt", prompt},
                         {"max_tokens", w.nc},
                         {"temperature", 0},
                         {"ignore_eos", true},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}},
                         {"return_token_ids", true}};
  if (!w.cache_namespace.empty()) body["cache_salt"] = w.cache_namespace;
  http::ClientRequest request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = body.dump();
  request.bearer_token = w.auth_token;
  request.request_id = absl::StrFormat("loadgen-%d", i);
  request.timeout = absl::Seconds(w.timeout_s);
  Timeline timeline(out);
  bool finished = false, done = false;
  std::string error;
  absl::StatusOr<http::ClientReply> reply = http::Call(base, request, [&](absl::string_view data) {
    if (data == "[DONE]") {
      done = true;
      return;
    }
    const nlohmann::json event = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (event.is_discarded() || !event.is_object()) {
      error = absl::StrCat("an event is not JSON: ", data.substr(0, 200));
    } else if (event.contains("error")) {
      error = absl::StrCat("error event: ", event["error"].value("message", std::string()));
    } else if (const nlohmann::json& choices = event.value("choices", nlohmann::json::array());
               choices.is_array() && !choices.empty()) {
      const nlohmann::json& choice = choices[0];
      std::vector<int32_t> ids;
      if (const auto it = choice.find("token_ids"); choice.is_object() && it != choice.end() && it->is_array()) {
        for (const nlohmann::json& id : *it) {
          if (id.is_number_integer()) ids.push_back(id.get<int32_t>());
        }
      } else {
        error = "a chunk has no token_ids (does the server support vLLM's return_token_ids?)";
      }
      timeline.Tokens(ids);
      if (choice.is_object() && choice.contains("finish_reason") && !choice["finish_reason"].is_null()) finished = true;
    } else if (const auto usage = event.find("usage"); usage != event.end() && usage->is_object()) {
      const nlohmann::json details = usage->value("prompt_tokens_details", nlohmann::json::object());
      if (details.is_object()) out->cached_prompt_tokens = details.value("cached_tokens", 0);
    }
  });
  if (!reply.ok()) {
    error = std::string(reply.status().message());
  } else if (reply->status != 200) {
    error = absl::StrFormat("HTTP %d: %s", reply->status, reply->body.substr(0, 500));
  } else if (error.empty() && !done) {
    error = "the stream ended without data: [DONE]";
  }
  timeline.Finish(finished, w.nc, std::move(error));
}

// FNV-1a over every request's completion, in request order: equal digests
// mean the runs returned the same tokens.
std::string Digest(const std::vector<Outcome>& outcomes) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const Outcome& o : outcomes) {
    mix(o.tokens.size());
    for (int32_t t : o.tokens) mix(static_cast<uint32_t>(t));
  }
  return absl::StrFormat("%016x", h);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string server = absl::GetFlag(FLAGS_server);
  const double rate = absl::GetFlag(FLAGS_rate), timeout_s = absl::GetFlag(FLAGS_timeout_s);
  const int requests = absl::GetFlag(FLAGS_requests), np = absl::GetFlag(FLAGS_np), ns = absl::GetFlag(FLAGS_ns),
            nc = absl::GetFlag(FLAGS_nc);
  if (absl::Status st = client::ValidateServer(server); !st.ok()) {
    std::fprintf(stderr, "--server: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  const std::string http_url = absl::GetFlag(FLAGS_http);
  std::optional<http::BaseUrl> http_base;
  if (!http_url.empty()) {
    absl::StatusOr<http::BaseUrl> parsed = http::ParseBaseUrl(http_url);
    if (!parsed.ok()) {
      std::fprintf(stderr, "--http: %s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    http_base = *std::move(parsed);
  }
  Workload workload;
  workload.nc = nc;
  workload.timeout_s = timeout_s;
  workload.cache_namespace = absl::GetFlag(FLAGS_cache_namespace);
  if (const char* token = std::getenv("CHUNKATTN_AUTH_TOKEN"); token != nullptr) {
    workload.auth_token = std::string(absl::StripAsciiWhitespace(token));
  }
  if (!(rate > 0 && rate <= 1e6) || requests < 1 || requests > 100000 || np < 1 || ns < 0 || ns > np || nc < 1 ||
      !(timeout_s > 0)) {
    std::fprintf(stderr,
                 "need --rate in (0, 1e6], --requests in [1, 100000], --np >= 1, 0 <= --ns <= --np, --nc >= 1, "
                 "--timeout_s > 0\n");
    return 2;
  }
  client::ChannelOptions channel_options;
  channel_options.server = server;
  channel_options.auth_token = workload.auth_token;
  const std::shared_ptr<grpc::Channel> channel = client::MakeChannel(channel_options);
  std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(channel);

  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, 30);
    const grpc::Status st = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!st.ok()) {
      client::PrintRpcError(st);
      return 1;
    }
  }
  if (static_cast<int64_t>(np) + nc > info.max_context()) {
    std::fprintf(stderr, "--np + --nc = %d exceeds the model's context of %u tokens\n", np + nc, info.max_context());
    return 2;
  }
  // The HTTP front's served name, and a check that it fronts the same model.
  std::string served_model;
  if (http_base) {
    http::ClientRequest models;
    models.path = "/v1/models";
    models.bearer_token = workload.auth_token;
    models.timeout = absl::Seconds(30);
    absl::StatusOr<http::ClientReply> reply = http::Call(*http_base, models);
    const nlohmann::json list = reply.ok() ? nlohmann::json::parse(reply->body, nullptr, false) : nlohmann::json();
    if (!reply.ok() || reply->status != 200 || !list.is_object() || !list.contains("data") ||
        !list["data"].is_array() || list["data"].empty() || !list["data"][0].is_object()) {
      std::fprintf(stderr, "GET %s/v1/models failed: %s\n", http_url.c_str(),
                   reply.ok() ? absl::StrFormat("HTTP %d %s", reply->status, reply->body.substr(0, 300)).c_str()
                              : std::string(reply.status().message()).c_str());
      return 1;
    }
    const nlohmann::json& card = list["data"][0];
    served_model = card.value("id", std::string());
    if (card.value("max_model_len", int64_t{-1}) != static_cast<int64_t>(info.max_context())) {
      std::fprintf(stderr, "--http serves max_model_len %lld, --server's model has %u: not the same server?\n",
                   static_cast<long long>(card.value("max_model_len", int64_t{-1})), info.max_context());
      return 2;
    }
  }
  // Token ids: avoid the first few (BOS/EOS/UNK in most vocabularies).
  const int32_t lo = std::min<int32_t>(16, static_cast<int32_t>(info.vocab_size()) - 1);
  const int32_t hi = static_cast<int32_t>(info.vocab_size()) - 1;
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::uniform_int_distribution<int32_t> token(lo, hi);
  std::vector<int32_t> shared(ns);
  for (int32_t& t : shared) t = token(rng);
  std::vector<std::vector<int32_t>> prompts(requests, shared);
  for (std::vector<int32_t>& p : prompts) {
    while (static_cast<int>(p.size()) < np) p.push_back(token(rng));
  }
  std::exponential_distribution<double> gap(rate);
  std::vector<double> arrival(requests);
  for (int i = 1; i < requests; ++i) arrival[i] = arrival[i - 1] + gap(rng);

  // The peaks this run reports start now (the coordinator may have served
  // other workloads since it started).
  {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, 30);
    v1::GetCacheStatsRequest reset;
    reset.set_reset_peaks(true);
    v1::CacheStats before;
    const grpc::Status st = stub->GetCacheStats(&ctx, reset, &before);
    if (!st.ok()) {
      client::PrintRpcError(st);
      return 1;
    }
  }
  // Poll the running batch while the load runs.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> peak_running{0};
  std::thread poller([&] {
    while (!done.load()) {
      grpc::ClientContext ctx;
      client::SetDeadline(&ctx, 5);
      v1::CacheStats stats;
      if (stub->GetCacheStats(&ctx, v1::GetCacheStatsRequest(), &stats).ok()) {
        uint64_t seen = peak_running.load();
        while (stats.running_requests() > seen && !peak_running.compare_exchange_weak(seen, stats.running_requests())) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  std::printf("loadgen: %d requests at %.3g/s (Poisson) over %s, n_p=%d n_s=%d n_c=%d, prefix sharing %s, model %s\n",
              requests, rate, http_base ? "HTTP" : "gRPC", np, ns, nc, info.prefix_sharing() ? "on" : "off",
              info.model().c_str());
  std::vector<Outcome> outcomes(requests);
  std::vector<std::thread> threads;
  threads.reserve(requests);
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < requests; ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival[i])));
    if (http_base) {
      threads.emplace_back(RunHttp, std::cref(*http_base), std::cref(served_model), std::cref(workload),
                           std::cref(prompts[i]), i, &outcomes[i]);
    } else {
      threads.emplace_back(RunGrpc, stub.get(), std::cref(workload), std::cref(prompts[i]), i, &outcomes[i]);
    }
  }
  for (std::thread& t : threads) t.join();
  done = true;
  poller.join();

  v1::CacheStats stats;
  {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, 30);
    const grpc::Status st = stub->GetCacheStats(&ctx, v1::GetCacheStatsRequest(), &stats);
    if (!st.ok()) {
      client::PrintRpcError(st);
      return 1;
    }
  }
  int ok = 0;
  int64_t tokens = 0, cached = 0;
  std::vector<double> norm, ttft, itl;
  Clock::time_point last_finish = t0;
  for (int i = 0; i < requests; ++i) {
    const Outcome& o = outcomes[i];
    if (!o.ok) {
      std::fprintf(stderr, "request %d failed: %s\n", i, o.error.c_str());
      continue;
    }
    ++ok;
    tokens += static_cast<int64_t>(o.tokens.size());
    cached += o.cached_prompt_tokens;
    norm.push_back(o.latency_s * 1e3 / static_cast<double>(o.tokens.size()));
    ttft.push_back(o.ttft_s * 1e3);
    for (double g : o.gaps_s) itl.push_back(g * 1e3);
    last_finish = std::max(last_finish, o.finished);
  }
  double mean_norm = 0;
  for (double x : norm) mean_norm += x / std::max<size_t>(1, norm.size());
  const double wall_s = Seconds(t0, last_finish);
  const double throughput = wall_s > 0 ? tokens / wall_s : 0;
  const double peak_kv = static_cast<double>(stats.peak_used_chunks()) * info.kv_chunk_bytes();
  const double peak_unshared = static_cast<double>(stats.peak_unshared_chunks()) * info.kv_chunk_bytes();
  std::printf("%-34s %12s\n", "metric", "value");
  std::printf("%-34s %12d\n", "requests ok", ok);
  std::printf("%-34s %12.2f\n", "normalized latency (ms/token)", mean_norm);
  std::printf("%-34s %12.1f\n", "throughput (completion tokens/s)", throughput);
  std::printf("%-34s %12.1f\n", "TTFT p50 (ms)", bench::Percentile(ttft, 50));
  std::printf("%-34s %12.1f\n", "TTFT p99 (ms)", bench::Percentile(ttft, 99));
  std::printf("%-34s %12.2f\n", "inter-token p50 (ms)", bench::Percentile(itl, 50));
  std::printf("%-34s %12.2f\n", "inter-token p99 (ms)", bench::Percentile(itl, 99));
  std::printf("%-34s %12.1f\n", "peak KV (MiB)", peak_kv / (1 << 20));
  std::printf("%-34s %12.1f\n", "peak KV unshared (MiB)", peak_unshared / (1 << 20));
  std::printf("%-34s %12llu\n", "peak running requests (polled)", static_cast<unsigned long long>(peak_running.load()));
  std::printf("%-34s %12.1f%%\n", "prompt tokens cached", 100.0 * cached / std::max<int64_t>(1, int64_t{ok} * np));

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json row = bench::Provenance(argc, argv);
    row["server"] = server;
    row["front"] = http_base ? "http" : "grpc";
    if (http_base) row["http"] = http_url;
    row["model"] = info.model();
    row["tensor_parallel_size"] = info.tensor_parallel_size();
    row["prefix_sharing"] = info.prefix_sharing();
    row["rate"] = rate;
    row["requests"] = requests;
    row["ok"] = ok;
    row["np"] = np;
    row["ns"] = ns;
    row["nc"] = nc;
    row["normalized_latency_ms_per_token"] = mean_norm;
    row["throughput_tokens_per_s"] = throughput;
    row["ttft_p50_ms"] = bench::Percentile(ttft, 50);
    row["ttft_p99_ms"] = bench::Percentile(ttft, 99);
    row["itl_p50_ms"] = bench::Percentile(itl, 50);
    row["itl_p99_ms"] = bench::Percentile(itl, 99);
    row["peak_kv_bytes"] = stats.peak_used_chunks() * info.kv_chunk_bytes();
    row["peak_kv_unshared_bytes"] = stats.peak_unshared_chunks() * info.kv_chunk_bytes();
    row["peak_used_chunks"] = stats.peak_used_chunks();
    row["peak_running_requests"] = peak_running.load();
    row["cached_prompt_tokens"] = cached;
    row["wall_s"] = wall_s;
    row["completion_digest"] = Digest(outcomes);
    std::ofstream f(path);
    f << bench::Dump(row) << "\n";
    if (!f.flush()) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    std::printf("wrote %s\n", path.c_str());
  }
  return ok == requests ? 0 : 1;
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) { return chunkattn::Main(argc, argv); }
