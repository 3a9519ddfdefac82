// chunkattn-forest-bench: the cache coordinator's per-step bookkeeping cost.
// 10,000 live sequences share 16 system prompts of 1-4k tokens, each with its
// own question; then decode steps append one token to each of 256 sequences,
// fetch the (C, i, j) context and mark the step's KV computed, as the
// scheduler does every iteration.
//
//   chunkattn-forest-bench --json=bench/results/forest-$(hostname).json
//
// Reported: inserts/s, the decode step time (median and p99 over steps,
// median over repeats), appends/s, and a full context rebuild with every
// sequence live. Timings are medians over --repeats fresh forests.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "services/core/prefix_forest.h"

ABSL_FLAG(int, sequences, 10000, "live sequences");
ABSL_FLAG(int, system_prompts, 16, "distinct system prompts");
ABSL_FLAG(int, system_min, 1024, "shortest system prompt, tokens");
ABSL_FLAG(int, system_max, 4096, "longest system prompt, tokens");
ABSL_FLAG(int, question_min, 32, "shortest question, tokens");
ABSL_FLAG(int, question_max, 256, "longest question, tokens");
ABSL_FLAG(int, batch, 256, "sequences appended per decode step");
ABSL_FLAG(int, steps, 256, "decode steps per repeat (>= chunk_size covers every chunk-full case)");
ABSL_FLAG(int, chunk_size, 64, "tokens per chunk");
ABSL_FLAG(int, repeats, 5, "fresh forests; timings are medians over them");
ABSL_FLAG(uint32_t, seed, 1, "workload seed");
ABSL_FLAG(std::string, json, "", "write results as JSON to this file");

namespace chunkattn {
namespace {

using Clock = std::chrono::steady_clock;
double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Repeat {
  double insert_us = 0;   // all inserts
  double step_median_us = 0;
  double step_p99_us = 0;
  double rebuild_us = 0;
  int64_t shared_chunks = 0;
  int64_t used_chunks = 0;
  int64_t logical_tokens = 0;
  int64_t physical_tokens = 0;
};

Repeat RunOnce(uint32_t seed) {
  const int n = absl::GetFlag(FLAGS_sequences);
  const int c = absl::GetFlag(FLAGS_chunk_size);
  const int batch = std::min(absl::GetFlag(FLAGS_batch), n);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  std::vector<std::vector<TokenId>> systems(absl::GetFlag(FLAGS_system_prompts));
  for (auto& s : systems) {
    s.resize(uniform(absl::GetFlag(FLAGS_system_min), absl::GetFlag(FLAGS_system_max)));
    for (auto& t : s) t = uniform(0, 31999);
  }
  std::vector<std::vector<TokenId>> prompts(n);
  int64_t worst_chunks = 0;
  for (auto& p : prompts) {
    p = systems[uniform(0, static_cast<int>(systems.size()) - 1)];
    const int q = uniform(absl::GetFlag(FLAGS_question_min), absl::GetFlag(FLAGS_question_max));
    for (int k = 0; k < q; ++k) p.push_back(uniform(0, 31999));
    worst_chunks += (static_cast<int64_t>(p.size()) + steps) / c + 2;
  }
  // Room for everything without sharing: the benchmark measures bookkeeping,
  // not eviction.
  auto forest = PrefixForest::Create({c, static_cast<int32_t>(std::min<int64_t>(worst_chunks, INT32_MAX)), 1 << 20})
                    .value();

  Repeat r;
  std::vector<SeqId> ids;
  ids.reserve(n);
  const auto t0 = Clock::now();
  // Each prefill runs before the next request arrives, so later requests hit
  // the system prompt the earlier ones computed.
  for (const auto& p : prompts) {
    ids.push_back(forest->Insert(p).value().seq_id);
    if (!forest->MarkComputed(ids.back()).ok()) std::abort();
  }
  r.insert_us = Us(Clock::now() - t0);
  forest->Context();

  // Decode: the same `batch` sequences every step, as a running batch is.
  std::vector<SeqId> running;
  for (int i = 0; i < batch; ++i) running.push_back(ids[static_cast<size_t>(i) * n / batch]);
  std::vector<double> step_us;
  const TokenId token[1] = {7};
  for (int s = 0; s < steps; ++s) {
    const auto begin = Clock::now();
    for (SeqId id : running) {
      if (!forest->Append(id, token).ok()) std::abort();
    }
    // What the scheduler does once the step has run.
    for (SeqId id : running) {
      if (!forest->MarkComputed(id).ok()) std::abort();
    }
    const ChunkContext& ctx = forest->Context();
    step_us.push_back(Us(Clock::now() - begin));
    if (ctx.num_seqs() != n) std::abort();
  }
  r.step_median_us = bench::Median(step_us);
  r.step_p99_us = bench::Percentile(step_us, 99);

  // A join or leave forces a full rebuild of the context.
  std::vector<double> rebuild_us;
  for (int k = 0; k < 5; ++k) {
    const SeqId leaving = ids[k];
    if (!forest->Remove(leaving).ok()) std::abort();
    ids[k] = forest->Insert(prompts[k]).value().seq_id;
    if (!forest->MarkComputed(ids[k]).ok()) std::abort();
    const auto begin = Clock::now();
    forest->Context();
    rebuild_us.push_back(Us(Clock::now() - begin));
  }
  r.rebuild_us = bench::Median(rebuild_us);
  const CacheStats st = forest->stats();
  r.shared_chunks = st.shared_chunks;
  r.used_chunks = st.used_chunks;
  r.logical_tokens = st.logical_tokens;
  r.physical_tokens = st.physical_tokens;
  return r;
}

int Main(int argc, char** argv) {
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (repeats < 1 || absl::GetFlag(FLAGS_sequences) < 1 || absl::GetFlag(FLAGS_steps) < 1 ||
      absl::GetFlag(FLAGS_batch) < 1 || !IsValidChunkSize(absl::GetFlag(FLAGS_chunk_size)) ||
      absl::GetFlag(FLAGS_system_min) < 0 || absl::GetFlag(FLAGS_system_max) < absl::GetFlag(FLAGS_system_min) ||
      absl::GetFlag(FLAGS_question_min) < 1 ||
      absl::GetFlag(FLAGS_question_max) < absl::GetFlag(FLAGS_question_min)) {
    std::fprintf(stderr, "chunkattn-forest-bench: invalid flags\n");
    return 2;
  }
  // Before the JSON file is (re)written, so it does not mark the tree dirty.
  const nlohmann::json provenance = bench::Provenance(argc, argv);
  std::vector<Repeat> runs;
  for (int i = 0; i < repeats; ++i) runs.push_back(RunOnce(absl::GetFlag(FLAGS_seed) + i));
  auto median = [&](double Repeat::*field) {
    std::vector<double> v;
    for (const Repeat& r : runs) v.push_back(r.*field);
    return bench::Median(v);
  };
  const int n = absl::GetFlag(FLAGS_sequences);
  const int batch = std::min(absl::GetFlag(FLAGS_batch), n);
  const double insert_us = median(&Repeat::insert_us);
  const double step_us = median(&Repeat::step_median_us);
  const double step_p99 = median(&Repeat::step_p99_us);
  const double rebuild_us = median(&Repeat::rebuild_us);
  const Repeat& last = runs.back();

  std::printf("prefix forest: %d live sequences, %d system prompts of %d-%d tokens, chunk %d, %d repeats\n", n,
              absl::GetFlag(FLAGS_system_prompts), absl::GetFlag(FLAGS_system_min), absl::GetFlag(FLAGS_system_max),
              absl::GetFlag(FLAGS_chunk_size), repeats);
  std::printf("  %-44s %12s\n", "metric", "value");
  std::printf("  %-44s %12.0f\n", "inserts/s (insert + mark computed)", n / (insert_us * 1e-6));
  std::printf("  %-44s %12.2f\n", "insert, us (mean)", insert_us / n);
  std::printf("  %-44s %12.1f\n", absl::StrFormat("decode step of %d sequences, us (median)", batch).c_str(), step_us);
  std::printf("  %-44s %12.1f\n", absl::StrFormat("decode step of %d sequences, us (p99)", batch).c_str(), step_p99);
  std::printf("  %-44s %12.0f\n", "appends/s (in decode steps)", batch / (step_us * 1e-6));
  std::printf("  %-44s %12.1f\n", absl::StrFormat("context rebuild, %d sequences, us", n).c_str(), rebuild_us);
  std::printf("  %-44s %12lld\n", "shared chunks", static_cast<long long>(last.shared_chunks));
  std::printf("  %-44s %11.1f%%\n", "memory saved (1 - physical/logical)",
              100.0 * (1.0 - static_cast<double>(last.physical_tokens) / last.logical_tokens));
  std::printf("  goal: decode step of 256 sequences under 50 us: %s\n", step_us < 50 ? "met" : "NOT met");

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    // Rates as whole numbers, as they always were.
    auto whole = [](double x) { return std::isfinite(x) ? nlohmann::json(std::llround(x)) : nlohmann::json(); };
    nlohmann::json row = provenance;
    row["benchmark"] = "forest";
    row["sequences"] = n;
    row["batch"] = batch;
    row["chunk_size"] = absl::GetFlag(FLAGS_chunk_size);
    row["repeats"] = repeats;
    row["inserts_per_s"] = whole(n / (insert_us * 1e-6));
    row["insert_us"] = insert_us / n;
    row["decode_step_us_median"] = step_us;
    row["decode_step_us_p99"] = step_p99;
    row["appends_per_s"] = whole(batch / (step_us * 1e-6));
    row["context_rebuild_us"] = rebuild_us;
    row["shared_chunks"] = last.shared_chunks;
    row["used_chunks"] = last.used_chunks;
    row["logical_tokens"] = last.logical_tokens;
    row["physical_tokens"] = last.physical_tokens;
    std::ofstream out(path);
    out << bench::Dump(row) << "\n";
    if (!out.flush()) {
      std::fprintf(stderr, "chunkattn-forest-bench: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return chunkattn::Main(argc, argv);
}
