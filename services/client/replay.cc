#include "services/client/replay.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "base/percentile.h"
#include "nlohmann/json.hpp"
#include "services/client/client.h"

namespace chunkattn::client {
namespace {

using Clock = std::chrono::steady_clock;

struct Totals {
  int ok = 0;
  int failed = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_prompt_tokens = 0;
  uint64_t completion_tokens = 0;
  std::vector<double> ttft_ms;  // per request that streamed a token
};

// Shared by the request threads; `mu` guards everything but the atomics.
struct ReplayState {
  std::atomic<int> next{0};
  std::atomic<uint64_t> streamed_tokens{0};  // token ids received so far
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  Totals totals;
  int errors_printed = 0;
};

constexpr int kMaxErrorsPrinted = 5;
constexpr double kMiB = 1024.0 * 1024.0;

void PrintProgress(const ReplayState& state, int total, Clock::time_point start, bool final) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const uint64_t tokens = state.streamed_tokens.load();
  const int width = static_cast<int>(std::to_string(total).size());
  std::fprintf(stderr, "\r[%*d/%d] %llu tokens, %.1f tok/s   %s", width, state.done, total,
               static_cast<unsigned long long>(tokens), tokens / std::max(seconds, 1e-9),
               final ? "\n" : "");
  std::fflush(stderr);
}

// One request, start to finish, on the calling thread.
void RunOne(v1::Generation::Stub* stub, const ReplayOptions& o, int i, ReplayState* state) {
  v1::GenerateRequest request;
  request.set_request_id("replay-" + std::to_string(i));
  request.set_text(o.system_prompt + "\n\n" + o.prompts[i % o.prompts.size()]);
  request.set_cache_namespace(o.cache_namespace);
  *request.mutable_sampling() = o.sampling;
  request.mutable_sampling()->set_seed(o.seed + static_cast<uint64_t>(i));
  *request.mutable_stopping() = o.stopping;

  grpc::ClientContext ctx;
  SetDeadline(&ctx, o.timeout_s);
  const Clock::time_point sent = Clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&ctx, request);
  v1::GenerateResponse response;
  v1::Usage usage;
  bool finished = false;
  double ttft_ms = -1;
  while (reader->Read(&response)) {
    if (ttft_ms < 0 && response.token_ids_size() > 0) {
      ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
    }
    state->streamed_tokens += response.token_ids_size();
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      usage = response.usage();
      finished = true;
    }
  }
  const grpc::Status status = reader->Finish();

  std::lock_guard<std::mutex> lock(state->mu);
  ++state->done;
  if (status.ok() && finished) {
    ++state->totals.ok;
    state->totals.prompt_tokens += usage.prompt_tokens();
    state->totals.cached_prompt_tokens += usage.cached_prompt_tokens();
    state->totals.completion_tokens += usage.completion_tokens();
    if (ttft_ms >= 0) state->totals.ttft_ms.push_back(ttft_ms);
  } else {
    ++state->totals.failed;
    if (state->errors_printed++ < kMaxErrorsPrinted) {
      std::fprintf(stderr, "\nrequest %d: ", i);
      if (status.ok()) {
        std::fprintf(stderr, "error: the stream ended without a finish reason\n");
      } else {
        PrintRpcError(status);
      }
    }
  }
  state->cv.notify_all();
}

}  // namespace

int RunReplay(const ReplayOptions& o) {
  std::shared_ptr<grpc::Channel> channel = MakeChannel(o.channel);
  std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(channel);

  ReplayState state;
  const Clock::time_point start = Clock::now();
  const int threads = std::min(o.concurrency, o.requests);
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int i = state.next++; i < o.requests; i = state.next++) RunOne(stub.get(), o, i, &state);
    });
  }
  // On a terminal the line moves with the tokens; in a log, one line per
  // finished request is enough.
  const bool tty = isatty(fileno(stderr)) != 0;
  {
    std::unique_lock<std::mutex> lock(state.mu);
    int shown = -1;
    while (state.done < o.requests) {
      if (tty || state.done != shown) {
        shown = state.done;
        PrintProgress(state, o.requests, start, false);
      }
      state.cv.wait_for(lock, std::chrono::milliseconds(250));
    }
  }
  for (std::thread& w : workers) w.join();
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  PrintProgress(state, o.requests, start, true);

  const Totals& t = state.totals;
  // The peak figures are the server's since it started: for a fresh server
  // they are this workload's.
  v1::ModelInfo info;
  v1::CacheStats stats;
  grpc::Status status;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, o.timeout_s);
    status = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
  }
  if (status.ok()) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, o.timeout_s);
    status = stub->GetCacheStats(&ctx, v1::GetCacheStatsRequest(), &stats);
  }
  if (!status.ok()) {
    PrintRpcError(status);
    return 1;
  }
  const double chunk_mib = static_cast<double>(info.kv_chunk_bytes()) / kMiB;
  const double hit_rate = 100.0 * t.cached_prompt_tokens / std::max<uint64_t>(1, t.prompt_tokens);
  const double saved = stats.peak_unshared_chunks() == 0
                           ? 0.0
                           : 100.0 * (1.0 - static_cast<double>(stats.peak_used_chunks()) /
                                                stats.peak_unshared_chunks());
  const double ttft_p50 = Percentile(t.ttft_ms, 50), ttft_p99 = Percentile(t.ttft_ms, 99);
  const double tokens_per_s = t.completion_tokens / std::max(wall_s, 1e-9);
  std::printf("%-26s %d ok, %d failed\n", "requests", t.ok, t.failed);
  std::printf("%-26s %.2f s\n", "wall time", wall_s);
  std::printf("%-26s %llu\n", "prompt tokens", static_cast<unsigned long long>(t.prompt_tokens));
  std::printf("%-26s %llu\n", "cached prompt tokens", static_cast<unsigned long long>(t.cached_prompt_tokens));
  std::printf("%-26s %.1f%%\n", "prefix hit rate", hit_rate);
  std::printf("%-26s %.0f ms p50, %.0f ms p99\n", "time to first token", ttft_p50, ttft_p99);
  std::printf("%-26s %llu\n", "completion tokens", static_cast<unsigned long long>(t.completion_tokens));
  std::printf("%-26s %.1f tokens/s\n", "generation throughput", tokens_per_s);
  std::printf("%-26s %.2f MiB (%llu chunks)\n", "peak KV memory, shared", stats.peak_used_chunks() * chunk_mib,
              static_cast<unsigned long long>(stats.peak_used_chunks()));
  std::printf("%-26s %.2f MiB (%llu chunks)\n", "peak KV memory, unshared",
              stats.peak_unshared_chunks() * chunk_mib, static_cast<unsigned long long>(stats.peak_unshared_chunks()));
  std::printf("%-26s %.1f%%\n", "KV memory saved", saved);
  std::fflush(stdout);

  if (!o.json_path.empty()) {
    const nlohmann::json summary = {{"model", info.model()},
                                    {"prefix_sharing", info.prefix_sharing()},
                                    {"tensor_parallel_size", info.tensor_parallel_size()},
                                    {"requests", o.requests},
                                    {"concurrency", o.concurrency},
                                    {"ok", t.ok},
                                    {"failed", t.failed},
                                    {"wall_s", wall_s},
                                    {"prompt_tokens", t.prompt_tokens},
                                    {"cached_prompt_tokens", t.cached_prompt_tokens},
                                    {"computed_prompt_tokens", t.prompt_tokens - t.cached_prompt_tokens},
                                    {"completion_tokens", t.completion_tokens},
                                    {"tokens_per_s", tokens_per_s},
                                    {"ttft_p50_ms", ttft_p50},
                                    {"ttft_p99_ms", ttft_p99},
                                    {"kv_chunk_bytes", info.kv_chunk_bytes()},
                                    {"peak_used_chunks", stats.peak_used_chunks()},
                                    {"peak_unshared_chunks", stats.peak_unshared_chunks()}};
    std::ofstream f(o.json_path);
    f << summary.dump(1) << "\n";
    if (!f.flush()) {
      std::fprintf(stderr, "error: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
  }
  return t.failed == 0 ? 0 : 1;
}

}  // namespace chunkattn::client
