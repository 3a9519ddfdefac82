// chunkattn-cache-replay: replays a multi-tenant, shared-system-prompt serving
// workload through the coordinator's Scheduler (the served path's admission,
// chunked prefill, in-batch sharing, copy-on-write, preemption and eviction)
// with an executor that computes nothing, and reports how much KV memory and
// prefill compute prefix sharing saves. Each request is a system prompt (one
// of a few, 1-4k tokens) + its own question, then decodes its completion.
//
//   chunkattn-cache-replay                       # the default workload
//   chunkattn-cache-replay --prefix_sharing=false  # the same without sharing
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
#include "services/core/chunk_allocator.h"
#include "services/core/null_executor.h"
#include "services/core/scheduler.h"

ABSL_FLAG(int, requests, 2000, "requests to replay");
ABSL_FLAG(int, system_prompts, 16, "distinct system prompts");
ABSL_FLAG(int, system_min, 1024, "shortest system prompt, tokens");
ABSL_FLAG(int, system_max, 4096, "longest system prompt, tokens");
ABSL_FLAG(int, question_min, 16, "shortest per-request question, tokens");
ABSL_FLAG(int, question_max, 256, "longest per-request question, tokens");
ABSL_FLAG(int, completion_min, 32, "shortest completion, tokens");
ABSL_FLAG(int, completion_max, 512, "longest completion, tokens");
ABSL_FLAG(int, arrivals_per_iteration, 8, "requests arriving per iteration");
ABSL_FLAG(int, max_batch, 256, "most sequences with rows in one iteration");
ABSL_FLAG(int, max_tokens_per_step, 2048, "most input rows in one iteration (the coordinator's default)");
ABSL_FLAG(int, chunk_size, 64, "tokens per KV chunk (power of two, 16..256)");
ABSL_FLAG(double, kv_budget_gib, 40.0, "KV pool size, GiB");
ABSL_FLAG(int, tenants, 1, "cache namespaces; system prompts are shared only within one");
ABSL_FLAG(bool, prefix_sharing, true, "share KV across requests (false: the baseline)");
ABSL_FLAG(int, report_every, 100, "print a table row every this many iterations (0: only the summary)");
ABSL_FLAG(uint32_t, seed, 1, "workload seed");
ABSL_FLAG(std::string, json, "", "also write the summary as JSON to this file");

namespace chunkattn {
namespace {

// Llama-2-7B in fp16: 32 layers, 32 KV heads of 128 dims, 512 KiB per token.
KvGeometry Llama7bGeometry(int chunk_size) { return KvGeometry{32, 32, chunk_size, 128, DType::kFloat16}; }

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

  if (absl::GetFlag(FLAGS_max_tokens_per_step) < 1) return Fail("--max_tokens_per_step must be >= 1");

  const KvGeometry geometry = Llama7bGeometry(chunk_size);
  const int64_t budget = static_cast<int64_t>(absl::GetFlag(FLAGS_kv_budget_gib) * (int64_t{1} << 30));
  auto allocator = ChunkAllocator::FromBudget(geometry, budget);
  if (!allocator.ok()) return Fail(std::string(allocator.status().message()));
  SchedulerOptions so;
  so.chunk_size = chunk_size;
  so.num_chunks = allocator->capacity();
  so.max_context = sys_max + q_max + c_max;
  so.max_batch_size = absl::GetFlag(FLAGS_max_batch);
  so.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  so.prefix_sharing = absl::GetFlag(FLAGS_prefix_sharing);
  auto created = Scheduler::Create(so);
  if (!created.ok()) return Fail(std::string(created.status().message()));
  Scheduler& scheduler = **created;

  // The workload: system prompts are random token strings; each request picks
  // one (and a tenant), adds its own question and a completion length.
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<TokenId>> systems(absl::GetFlag(FLAGS_system_prompts));
  for (auto& s : systems) {
    s.resize(uniform(sys_min, sys_max));
    for (auto& t : s) t = uniform(3, 31999);
  }
  std::deque<RequestSpec> waiting;
  for (int i = 0; i < requests; ++i) {
    RequestSpec r;
    r.prompt = systems[uniform(0, static_cast<int>(systems.size()) - 1)];
    const int q = uniform(q_min, q_max);
    for (int k = 0; k < q; ++k) r.prompt.push_back(uniform(3, 31999));
    r.cache_namespace = tenants == 1 ? "" : absl::StrFormat("tenant-%d", uniform(0, tenants - 1));
    r.max_new_tokens = uniform(c_min, c_max);
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    waiting.push_back(std::move(r));
  }

  std::printf("chunkattn cache replay: %d requests, %zu system prompts of %d-%d tokens, %d tenant(s), "
              "prefix sharing %s\n",
              requests, systems.size(), sys_min, sys_max, tenants, so.prefix_sharing ? "on" : "off");
  std::printf("KV pool: %d chunks of %d tokens (%.1f GiB of Llama-2-7B fp16 KV, %.0f KiB/token)\n\n",
              so.num_chunks, chunk_size, static_cast<double>(budget) / (1 << 30), geometry.BytesPerToken() / 1024.0);
  const char* header = "%9s %8s %8s %14s %15s %13s %16s\n";
  const char* row = "%9d %8" PRId64 " %8" PRId64 " %14" PRId64 " %15" PRId64 " %12.1f%% %15.1f%%\n";
  const int report_every = absl::GetFlag(FLAGS_report_every);
  if (report_every > 0) {
    std::printf(header, "iteration", "running", "waiting", "logical_tokens", "physical_tokens", "memory_saved",
                "prefix_hit_rate");
  }

  const size_t arrivals = absl::GetFlag(FLAGS_arrivals_per_iteration);
  int64_t peak_logical = 0, peak_physical = 0, peak_batch = 0, finished = 0, computed_prompt_rows = 0;
  double saved_at_peak = 0;
  int iteration = 0;
  RequestId next_id = 0;
  auto hit_rate = [](const CacheStats& s) {
    return s.total_prompt_tokens ? 100.0 * s.total_matched_tokens / s.total_prompt_tokens : 0.0;
  };
  auto saved = [](const CacheStats& s) {
    return s.logical_tokens ? 100.0 * (1.0 - static_cast<double>(s.physical_tokens) / s.logical_tokens) : 0.0;
  };
  StepPlan plan;
  StepResult result;
  std::vector<SampleEvent> events;
  while (!waiting.empty() || scheduler.HasWork()) {
    for (size_t k = 0; k < arrivals && !waiting.empty(); ++k) {
      absl::Status added = scheduler.Add(next_id++, std::move(waiting.front()));
      waiting.pop_front();
      if (!added.ok()) return Fail("a request the pool can never hold: " + added.ToString());
    }
    absl::StatusOr<bool> scheduled = scheduler.Schedule(&plan);
    if (!scheduled.ok()) return Fail(scheduled.status().ToString());
    if (!*scheduled) {
      if (waiting.empty()) return Fail("requests wait but the scheduler planned no step");
      continue;
    }
    // Prompt rows computed: the prefill pieces, and each first decode row of
    // a prompt (a decode row whose sample has produced nothing yet).
    computed_prompt_rows += plan.prefill.num_tokens();
    for (const SampleRow& r : plan.samples) computed_prompt_rows += r.step == 0 ? 1 : 0;
    events.clear();
    NullExecute(plan, &result);
    if (absl::Status s = scheduler.Complete(result, &events); !s.ok()) return Fail(s.ToString());
    for (const SampleEvent& e : events) finished += e.request_done ? 1 : 0;
    const CacheStats s = scheduler.cache_stats();
    const SchedulerStats st = scheduler.stats();
    peak_batch = std::max<int64_t>(peak_batch, static_cast<int64_t>(plan.seq_len.size()));
    if (s.logical_tokens > peak_logical) {
      peak_logical = s.logical_tokens;
      peak_physical = s.physical_tokens;
      saved_at_peak = saved(s);
    }
    ++iteration;
    if (report_every > 0 && iteration % report_every == 0) {
      std::printf(row, iteration, st.running_requests, st.waiting_requests + static_cast<int64_t>(waiting.size()),
                  s.logical_tokens, s.physical_tokens, saved(s), hit_rate(s));
    }
  }

  const CacheStats s = scheduler.cache_stats();
  const SchedulerStats st = scheduler.stats();
  const double gib_per_token = static_cast<double>(geometry.BytesPerToken()) / (1 << 30);
  std::printf("\nsummary\n");
  std::printf("  %-34s %" PRId64 "\n", "requests finished", finished);
  std::printf("  %-34s %" PRId64 "\n", "preemptions (pool full)", st.preemptions_total);
  std::printf("  %-34s %d\n", "iterations", iteration);
  std::printf("  %-34s %" PRId64 "\n", "peak decode batch", peak_batch);
  std::printf("  %-34s %" PRId64 " (%.1f GiB)\n", "peak logical KV tokens", peak_logical,
              peak_logical * gib_per_token);
  std::printf("  %-34s %" PRId64 " (%.1f GiB)\n", "physical KV tokens at that peak", peak_physical,
              peak_physical * gib_per_token);
  std::printf("  %-34s %.1f%%\n", "memory saved at peak", saved_at_peak);
  std::printf("  %-34s %" PRId64 " of %" PRId64 "\n", "prompt tokens found in cache", s.total_matched_tokens,
              s.total_prompt_tokens);
  std::printf("  %-34s %.1f%%\n", "prefix hit rate", hit_rate(s));
  std::printf("  %-34s %" PRId64 "\n", "prompt tokens computed", computed_prompt_rows);
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
        "\"prompt_tokens\": %d, \"matched_tokens\": %d, \"prefix_hit_rate\": %.4f, "
        "\"computed_prompt_tokens\": %d, \"copies\": %d, \"evictions\": %d, \"chunk_size\": %d, "
        "\"pool_chunks\": %d, \"prefix_sharing\": %s}\n",
        requests, finished, st.preemptions_total, iteration, peak_batch, peak_logical, peak_physical,
        saved_at_peak / 100, s.total_prompt_tokens, s.total_matched_tokens, hit_rate(s) / 100, computed_prompt_rows,
        s.total_copies, s.total_evictions, chunk_size, so.num_chunks, so.prefix_sharing ? "true" : "false");
    if (!out) return Fail("cannot write " + path);
  }
  if (s.used_chunks != 0) return Fail(absl::StrFormat("%d chunks still in use after every request finished", s.used_chunks));
  return finished == requests ? 0 : 1;
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return chunkattn::Main();
}
