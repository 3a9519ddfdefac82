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
//   chunkattn-loadgen --server 127.0.0.1:50051 --rate 2 --requests 64 --np 1024 --ns 512 --nc 64 --json out.json
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "chunkattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "services/client/client.h"

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

namespace chunkattn {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Outcome {
  bool ok = false;
  std::string error;
  double latency_s = 0, ttft_s = 0;
  std::vector<double> gaps_s;  // between consecutive streamed tokens
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;
  Clock::time_point finished;
};

void RunOne(v1::Generation::Stub* stub, const std::vector<int32_t>& prompt, int nc, double timeout_s, int i,
            Outcome* out) {
  v1::GenerateRequest request;
  request.set_request_id(absl::StrFormat("loadgen-%d", i));
  for (int32_t id : prompt) request.mutable_token_ids()->add_ids(id);
  request.set_cache_namespace(absl::GetFlag(FLAGS_cache_namespace));
  request.mutable_sampling()->set_temperature(0);
  request.mutable_stopping()->set_max_new_tokens(nc);
  request.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  client::SetDeadline(&ctx, timeout_s);
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&ctx, request);
  v1::GenerateResponse response;
  bool finished = false;
  while (reader->Read(&response)) {
    const Clock::time_point now = Clock::now();
    if (response.token_ids_size() > 0) {
      if (out->completion_tokens == 0) {
        out->ttft_s = Seconds(start, now);
      } else {
        out->gaps_s.push_back(Seconds(last, now) / response.token_ids_size());
      }
      out->completion_tokens += response.token_ids_size();
      last = now;
    }
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      finished = true;
      out->cached_prompt_tokens = static_cast<int>(response.usage().cached_prompt_tokens());
    }
  }
  const grpc::Status status = reader->Finish();
  out->finished = Clock::now();
  out->latency_s = Seconds(start, out->finished);
  out->ok = status.ok() && finished && out->completion_tokens == nc;
  if (!status.ok()) {
    out->error = absl::StrFormat("%d: %s", static_cast<int>(status.error_code()), status.error_message());
  } else if (!out->ok) {
    out->error = absl::StrFormat("finished with %d of %d tokens", out->completion_tokens, nc);
  }
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
  if (!(rate > 0 && rate <= 1e6) || requests < 1 || requests > 100000 || np < 1 || ns < 0 || ns > np || nc < 1 ||
      !(timeout_s > 0)) {
    std::fprintf(stderr,
                 "need --rate in (0, 1e6], --requests in [1, 100000], --np >= 1, 0 <= --ns <= --np, --nc >= 1, "
                 "--timeout_s > 0\n");
    return 2;
  }
  client::ChannelOptions channel_options;
  channel_options.server = server;
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

  std::printf("loadgen: %d requests at %.3g/s (Poisson), n_p=%d n_s=%d n_c=%d, prefix sharing %s, model %s\n",
              requests, rate, np, ns, nc, info.prefix_sharing() ? "on" : "off", info.model().c_str());
  std::vector<Outcome> outcomes(requests);
  std::vector<std::thread> threads;
  threads.reserve(requests);
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < requests; ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival[i])));
    threads.emplace_back(RunOne, stub.get(), std::cref(prompts[i]), nc, timeout_s, i, &outcomes[i]);
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
    tokens += o.completion_tokens;
    cached += o.cached_prompt_tokens;
    norm.push_back(o.latency_s * 1e3 / o.completion_tokens);
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
