// chunkattn-cache-replay: replays a multi-tenant, shared-system-prompt serving
// workload through the prefix-aware KV cache and reports how much KV memory
// sharing saves. No model runs: each request is a system prompt (one of a few,
// 1-4k tokens) + its own question, then decodes its completion one token per
// iteration with iteration-level batching, as the coordinator's scheduler will.
//
//   chunkattn-cache-replay                       # the default workload
//   chunkattn-cache-replay --requests=500 --json=out.json
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "kernels/api/kv_layout.h"
#include "services/cache/prefix_forest.h"

ABSL_FLAG(int, requests, 2000, "requests to replay");
ABSL_FLAG(int, system_prompts, 16, "distinct system prompts");
ABSL_FLAG(int, system_min, 1024, "shortest system prompt, tokens");
ABSL_FLAG(int, system_max, 4096, "longest system prompt, tokens");
ABSL_FLAG(int, question_min, 16, "shortest per-request question, tokens");
ABSL_FLAG(int, question_max, 256, "longest per-request question, tokens");
ABSL_FLAG(int, completion_min, 32, "shortest completion, tokens");
ABSL_FLAG(int, completion_max, 512, "longest completion, tokens");
ABSL_FLAG(int, arrivals_per_iteration, 8, "requests arriving per decode iteration");
ABSL_FLAG(int, max_batch, 256, "most sequences decoding at once");
ABSL_FLAG(int, chunk_size, 64, "tokens per KV chunk (power of two, 16..256)");
ABSL_FLAG(double, kv_budget_gib, 40.0, "KV pool size, GiB");
ABSL_FLAG(int, tenants, 1, "cache namespaces; system prompts are shared only within one");
ABSL_FLAG(int, report_every, 100, "print a table row every this many iterations (0: only the summary)");
ABSL_FLAG(uint32_t, seed, 1, "workload seed");
ABSL_FLAG(std::string, json, "", "also write the summary as JSON to this file");

namespace chunkattn {
namespace {

// Llama-2-7B in fp16: 32 layers, 32 KV heads of 128 dims, 512 KiB per token.
KvGeometry Llama7bGeometry(int chunk_size) { return KvGeometry{32, 32, chunk_size, 128, DType::kFloat16}; }

struct Request {
  std::vector<TokenId> prompt;
  std::string ns;
  int completion = 0;
};

struct Running {
  SeqId seq = 0;
  int remaining = 0;
  std::string ns;
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "chunkattn-cache-replay: %s\n", msg.c_str());
  return 2;
}

int Main() {
  const int requests = absl::GetFlag(FLAGS_requests);
  const int chunk_size = absl::GetFlag(FLAGS_chunk_size);
  const int sys_min = absl::GetFlag(FLAGS_system_min), sys_max = absl::GetFlag(FLAGS_system_max);
  const int q_min = absl::GetFlag(FLAGS_question_min), q_max = absl::GetFlag(FLAGS_question_max);
  const int c_min = absl::GetFlag(FLAGS_completion_min), c_max = absl::GetFlag(FLAGS_completion_max);
  const int tenants = absl::GetFlag(FLAGS_tenants);
  if (requests < 1) return Fail("--requests must be >= 1");
  if (absl::GetFlag(FLAGS_system_prompts) < 1) return Fail("--system_prompts must be >= 1");
  if (sys_min < 0 || sys_max < sys_min) return Fail("need 0 <= --system_min <= --system_max");
  if (q_min < 1 || q_max < q_min) return Fail("need 1 <= --question_min <= --question_max");
  if (c_min < 1 || c_max < c_min) return Fail("need 1 <= --completion_min <= --completion_max");
  if (absl::GetFlag(FLAGS_max_batch) < 1) return Fail("--max_batch must be >= 1");
  if (absl::GetFlag(FLAGS_arrivals_per_iteration) < 1) return Fail("--arrivals_per_iteration must be >= 1");
  if (tenants < 1) return Fail("--tenants must be >= 1");
  if (!IsValidChunkSize(chunk_size)) return Fail("--chunk_size must be a power of two in [16, 256]");

  const KvGeometry geometry = Llama7bGeometry(chunk_size);
  const int64_t budget = static_cast<int64_t>(absl::GetFlag(FLAGS_kv_budget_gib) * (int64_t{1} << 30));
  auto allocator = ChunkAllocator::FromBudget(geometry, budget);
  if (!allocator.ok()) return Fail(std::string(allocator.status().message()));
  auto created = PrefixForest::Create({chunk_size, allocator->capacity(), 1 << 20});
  if (!created.ok()) return Fail(std::string(created.status().message()));
  PrefixForest& forest = **created;

  // The workload: system prompts are random token strings; each request picks
  // one (and a tenant), adds its own question and a completion length.
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<TokenId>> systems(absl::GetFlag(FLAGS_system_prompts));
  for (auto& s : systems) {
    s.resize(uniform(sys_min, sys_max));
    for (auto& t : s) t = uniform(3, 31999);
  }
  std::deque<Request> waiting;
  for (int i = 0; i < requests; ++i) {
    Request r;
    r.prompt = systems[uniform(0, static_cast<int>(systems.size()) - 1)];
    const int q = uniform(q_min, q_max);
    for (int k = 0; k < q; ++k) r.prompt.push_back(uniform(3, 31999));
    r.ns = tenants == 1 ? "" : absl::StrFormat("tenant-%d", uniform(0, tenants - 1));
    r.completion = uniform(c_min, c_max);
    waiting.push_back(std::move(r));
  }

  std::printf("chunkattn cache replay: %d requests, %zu system prompts of %d-%d tokens, %d tenant(s)\n", requests,
              systems.size(), sys_min, sys_max, tenants);
  std::printf("KV pool: %d chunks of %d tokens (%.1f GiB of Llama-2-7B fp16 KV, %.0f KiB/token)\n\n",
              forest.capacity(), chunk_size, static_cast<double>(budget) / (1 << 30),
              geometry.BytesPerToken() / 1024.0);
  const char* header = "%9s %8s %8s %14s %15s %13s %16s\n";
  const char* row = "%9d %8zu %8zu %14" PRId64 " %15" PRId64 " %12.1f%% %15.1f%%\n";
  const int report_every = absl::GetFlag(FLAGS_report_every);
  if (report_every > 0) {
    std::printf(header, "iteration", "running", "waiting", "logical_tokens", "physical_tokens", "memory_saved",
                "prefix_hit_rate");
  }

  const size_t max_batch = absl::GetFlag(FLAGS_max_batch);
  const size_t arrivals = absl::GetFlag(FLAGS_arrivals_per_iteration);
  std::deque<Request> queue;  // arrived, not admitted yet
  std::vector<Running> running;
  int64_t peak_logical = 0, peak_physical = 0, peak_batch = 0, preempted = 0, finished = 0;
  double saved_at_peak = 0;
  int iteration = 0;
  auto hit_rate = [](const CacheStats& s) {
    return s.total_prompt_tokens ? 100.0 * s.total_matched_tokens / s.total_prompt_tokens : 0.0;
  };
  auto saved = [](const CacheStats& s) {
    return s.logical_tokens ? 100.0 * (1.0 - static_cast<double>(s.physical_tokens) / s.logical_tokens) : 0.0;
  };
  while (!waiting.empty() || !queue.empty() || !running.empty()) {
    for (size_t k = 0; k < arrivals && !waiting.empty(); ++k) {
      queue.push_back(std::move(waiting.front()));
      waiting.pop_front();
    }
    // Decode: every sequence prefilled in an earlier iteration grows by one
    // token. When the pool is full the newest sequence is preempted: it leaves
    // (its KV stays cached) and goes back to the head of the queue with what
    // it generated.
    for (size_t i = 0; i < running.size();) {
      auto a = forest.Append(running[i].seq, {static_cast<TokenId>(uniform(3, 31999))});
      if (!a.ok()) {
        if (a.status().code() != absl::StatusCode::kResourceExhausted) return Fail(a.status().ToString());
        Running victim = std::move(running.back());
        running.pop_back();
        Request again{*forest.Tokens(victim.seq), victim.ns, victim.remaining};
        (void)forest.Remove(victim.seq);
        queue.push_front(std::move(again));
        ++preempted;
        continue;  // retry sequence i (unless it was the one preempted)
      }
      ++i;
    }
    // Admission: FCFS while the batch and the pool have room, keeping one
    // free-or-evictable chunk per running sequence so the admitted batch can
    // grow (a watermark, as vLLM keeps) instead of preempting at once.
    auto headroom = [&] {
      const CacheStats s = forest.stats();
      return int64_t{s.free_chunks} + s.cached_chunks > static_cast<int64_t>(running.size());
    };
    while (!queue.empty() && running.size() < max_batch && (running.empty() || headroom())) {
      auto r = forest.Insert(queue.front().prompt, queue.front().ns);
      if (!r.ok()) {
        if (r.status().code() != absl::StatusCode::kResourceExhausted) return Fail(r.status().ToString());
        if (running.empty()) return Fail("a single request does not fit: " + r.status().ToString());
        break;
      }
      running.push_back({r->seq_id, queue.front().completion, queue.front().ns});
      queue.pop_front();
    }
    // The step runs: prefills and decodes write their KV.
    forest.MarkAllComputed();
    const CacheStats s = forest.stats();
    peak_batch = std::max<int64_t>(peak_batch, static_cast<int64_t>(running.size()));
    if (s.logical_tokens > peak_logical) {
      peak_logical = s.logical_tokens;
      peak_physical = s.physical_tokens;
      saved_at_peak = saved(s);
    }
    // Each sequence produced one token this step.
    for (size_t i = 0; i < running.size();) {
      if (--running[i].remaining == 0) {
        (void)forest.Remove(running[i].seq);
        running[i] = running.back();
        running.pop_back();
        ++finished;
      } else {
        ++i;
      }
    }
    ++iteration;
    if (report_every > 0 && iteration % report_every == 0) {
      std::printf(row, iteration, running.size(), queue.size() + waiting.size(), s.logical_tokens,
                  s.physical_tokens, saved(s), hit_rate(s));
    }
  }

  const CacheStats s = forest.stats();
  const double gib_per_token = static_cast<double>(geometry.BytesPerToken()) / (1 << 30);
  std::printf("\nsummary\n");
  std::printf("  %-34s %" PRId64 "\n", "requests finished", finished);
  std::printf("  %-34s %" PRId64 "\n", "preemptions (pool full)", preempted);
  std::printf("  %-34s %d\n", "decode iterations", iteration);
  std::printf("  %-34s %" PRId64 "\n", "peak batch", peak_batch);
  std::printf("  %-34s %" PRId64 " (%.1f GiB)\n", "peak logical KV tokens", peak_logical,
              peak_logical * gib_per_token);
  std::printf("  %-34s %" PRId64 " (%.1f GiB)\n", "physical KV tokens at that peak", peak_physical,
              peak_physical * gib_per_token);
  std::printf("  %-34s %.1f%%\n", "memory saved at peak", saved_at_peak);
  std::printf("  %-34s %" PRId64 " of %" PRId64 "\n", "prompt tokens found in cache", s.total_matched_tokens,
              s.total_prompt_tokens);
  std::printf("  %-34s %.1f%%\n", "prefix hit rate", hit_rate(s));
  std::printf("  %-34s %" PRId64 " (%" PRId64 " tokens)\n", "KV copies (copy-on-write)", s.total_copies,
              s.total_copied_tokens);
  std::printf("  %-34s %" PRId64 "\n", "chunks evicted", s.total_evictions);
  std::printf("  %-34s %d used, %d cached, %d free\n", "pool at the end", s.used_chunks, s.cached_chunks,
              s.free_chunks);

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream out(path);
    out << absl::StrFormat(
        "{\"requests\": %d, \"finished\": %d, \"preemptions\": %d, \"iterations\": %d, \"peak_batch\": %d, "
        "\"peak_logical_tokens\": %d, \"peak_physical_tokens\": %d, \"memory_saved_at_peak\": %.4f, "
        "\"prompt_tokens\": %d, \"matched_tokens\": %d, \"prefix_hit_rate\": %.4f, \"copies\": %d, "
        "\"evictions\": %d, \"chunk_size\": %d, \"pool_chunks\": %d}\n",
        requests, finished, preempted, iteration, peak_batch, peak_logical, peak_physical, saved_at_peak / 100,
        s.total_prompt_tokens, s.total_matched_tokens, hit_rate(s) / 100, s.total_copies, s.total_evictions,
        chunk_size, forest.capacity());
    if (!out) return Fail("cannot write " + path);
  }
  return finished == requests ? 0 : 1;
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return chunkattn::Main();
}
