// chunkattn-linear-bench: a decode step's Linear layers alone on the CPU
// kernels, for the matrices of a model's config.json (--model DIR; seeded
// random weights, DummyWeights, held as the CPU model holds them: fp32 and
// 16-bit rows packed, int8 interleaved with fp16 scales). Per weight dtype,
// one step is every layer's qkv, o, gate_up and down, then the LM head, each a
// cpu::LinearRows over --rows activation rows on --threads threads: median
// step time over --steps steps in each of --repeats runs (the median of the
// runs' medians), and the bytes those matrices hold over it.
//
// Beside them, in the same run and on the same pool, two plain reads: a
// buffer of one step's bytes read back to back as the steps read theirs, and
// 1 GiB (peer_bench.py's floor divides by a 1 GiB read). Where a cache keeps
// part of a working set of some 100 MB between passes (the 2-core VM this
// project measures on does), the first is faster, and a step can beat the
// floor the second gives.
//
//   chunkattn-linear-bench --model build/peer/llama-156m-float32 --json bench/results/linear-cpu-2core.json
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "bench/bench_util.h"
#include "kernels/cpu/attention.h"
#include "nlohmann/json.hpp"
#include "proto/model/model_config.h"
#include "workers/model/weights.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model folder: only its config.json is read");
ABSL_FLAG(std::string, weight_dtypes, "float32,float16,bfloat16,int8", "comma-separated --weight_dtype values");
ABSL_FLAG(int, rows, 1, "activation rows (sequences decoding together)");
ABSL_FLAG(int, threads, 0, "CPU threads (0 = one per core)");
ABSL_FLAG(std::string, cpu_isa, "best", "CPU kernels: best | avx512 | avx2 | portable");
ABSL_FLAG(int, steps, 30, "timed steps per run");
ABSL_FLAG(int, repeats, 5, "runs (each dtype's runs interleave with the reads')");
ABSL_FLAG(std::string, json, "", "write the rows here");

namespace chunkattn {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sum of n 64-bit words, with eight independent sums so loads, not adds,
// bound it: 256-bit loads where the CPU has AVX2 (as peer_bench.py's read).
uint64_t SumWordsPortable(const uint64_t* p, int64_t n) {
  uint64_t s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += p[i + k];
  for (; i < n; ++i) s[0] += p[i];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t SumWordsAvx2(const uint64_t* p, int64_t n) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const auto* v = reinterpret_cast<const __m256i*>(p + i);
    s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(v));
    s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(v + 1));
    s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(v + 2));
    s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(v + 3));
    s4 = _mm256_add_epi64(s4, _mm256_loadu_si256(v + 4));
    s5 = _mm256_add_epi64(s5, _mm256_loadu_si256(v + 5));
    s6 = _mm256_add_epi64(s6, _mm256_loadu_si256(v + 6));
    s7 = _mm256_add_epi64(s7, _mm256_loadu_si256(v + 7));
  }
  s0 = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)),
                        _mm256_add_epi64(_mm256_add_epi64(s4, s5), _mm256_add_epi64(s6, s7)));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s0);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + SumWordsPortable(p + i, n - i);
}
#endif

uint64_t SumWords(const uint64_t* p, int64_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return SumWordsAvx2(p, n);
#endif
  return SumWordsPortable(p, n);
}

// One pass over `buf` by the pool, each thread a contiguous share.
uint64_t ReadPass(const std::vector<uint64_t>& buf, ThreadPool& pool) {
  const int t = pool.num_threads();
  const int64_t n = static_cast<int64_t>(buf.size()), per = (n + t - 1) / t;
  std::vector<uint64_t> sums(static_cast<size_t>(t) * 8);
  pool.ParallelFor(t, [&](int64_t i, int) {
    const int64_t b = std::min(n, i * per), e = std::min(n, b + per);
    sums[i * 8] = SumWords(buf.data() + b, e - b);
  });
  uint64_t s = 0;
  for (int i = 0; i < t; ++i) s += sums[i * 8];
  return s;
}

// The matrices one decode step reads, in order.
std::vector<const WeightMatrix*> StepMatrices(const ModelWeights& w) {
  std::vector<const WeightMatrix*> out;
  for (const LayerWeights& l : w.layers) {
    for (const WeightMatrix* m : {&l.qkv, &l.o, &l.gate_up, &l.down}) out.push_back(m);
  }
  out.push_back(&w.output_embedding());
  return out;
}

absl::Status Run(int argc, char** argv) {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return absl::InvalidArgumentError("--model DIR is required (a folder with config.json)");
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(dir));
  const int rows = absl::GetFlag(FLAGS_rows), steps = absl::GetFlag(FLAGS_steps),
            repeats = absl::GetFlag(FLAGS_repeats);
  if (rows < 1 || rows > 4096 || steps < 1 || repeats < 1) {
    return absl::InvalidArgumentError("--rows in [1, 4096], --steps and --repeats >= 1");
  }
  ASSIGN_OR_RETURN(const cpu::Isa isa, cpu::ParseIsa(absl::GetFlag(FLAGS_cpu_isa)));
  ThreadPool pool(absl::GetFlag(FLAGS_threads));
  bench::JsonArrayFile out(absl::GetFlag(FLAGS_json));
  const nlohmann::json provenance = bench::Provenance(argc, argv);

  std::printf("%s: hidden %d, %d layers, intermediate %d, vocab %d; %d row(s), %d thread(s), %s kernels\n",
              dir.c_str(), config.hidden_size, config.num_layers, config.intermediate_size, config.vocab_size,
              rows, pool.num_threads(), cpu::IsaName(isa));
  std::printf("| weights | MB a step | step ms | GB/s | read, same bytes: GB/s | read, 1 GiB: GB/s | step vs same-bytes read | step vs 1 GiB floor |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::vector<uint64_t> gib((size_t{1} << 30) / 8, 1);
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_weight_dtypes), ',')) {
    ASSIGN_OR_RETURN(const WeightDType dtype, ParseWeightDType(std::string(name)));
    ASSIGN_OR_RETURN(ModelWeights weights, DummyWeights(config, {}, 1, dtype));
    weights.Pack();  // as the CPU model holds them
    const std::vector<const WeightMatrix*> mats = StepMatrices(weights);
    int64_t bytes = 0, widest = 0;
    for (const WeightMatrix* m : mats) {
      bytes += m->bytes();
      widest = std::max({widest, m->rows, m->cols});
    }
    std::vector<float> a(static_cast<size_t>(rows) * widest), c(static_cast<size_t>(rows) * widest);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    std::vector<uint64_t> same(static_cast<size_t>(bytes / 8), 1);

    auto step = [&]() -> absl::Status {
      for (const WeightMatrix* m : mats) {
        RETURN_IF_ERROR(cpu::LinearRows(a.data(), rows, m->cols, m->View(), m->rows, c.data(), &pool, isa));
      }
      return absl::OkStatus();
    };
    // Median seconds of `steps` calls of f, after one untimed.
    auto time = [&](auto f) -> absl::StatusOr<double> {
      std::vector<double> t;
      for (int s = 0; s <= steps; ++s) {
        const auto t0 = Clock::now();
        RETURN_IF_ERROR(f());
        if (s > 0) t.push_back(Seconds(t0));
      }
      return bench::Median(t);
    };
    uint64_t sink = 0;
    std::vector<double> step_s, same_s, gib_s;
    for (int r = 0; r < repeats; ++r) {
      ASSIGN_OR_RETURN(const double s1, time(step));
      ASSIGN_OR_RETURN(const double s2, time([&] {
                         sink += ReadPass(same, pool);
                         return absl::OkStatus();
                       }));
      for (int pass = 0; pass < 3; ++pass) {
        const auto t0 = Clock::now();
        sink += ReadPass(gib, pool);
        gib_s.push_back(Seconds(t0));
      }
      step_s.push_back(s1);
      same_s.push_back(s2);
    }
    const double st = bench::Median(step_s), sm = bench::Median(same_s), gb = bench::Median(gib_s);
    const double step_gbs = bytes / st / 1e9, same_gbs = bytes / sm / 1e9, gib_gbs = gib.size() * 8 / gb / 1e9;
    std::printf("| %s | %.1f | %.3f | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n", WeightDTypeName(dtype), bytes / 1e6,
                st * 1e3, step_gbs, same_gbs, gib_gbs, st / sm, st / (bytes / (gib_gbs * 1e9)));
    std::fflush(stdout);
    nlohmann::json row = provenance;
    row["benchmark"] = "decode Linear step (CPU)";
    row["model"] = dir;
    row["weight_dtype"] = WeightDTypeName(dtype);
    row["rows"] = rows;
    row["threads"] = pool.num_threads();
    row["isa"] = cpu::IsaName(isa);
    row["step_bytes"] = bytes;
    row["step_ms"] = st * 1e3;
    row["step_gbs"] = step_gbs;
    row["read_same_bytes_gbs"] = same_gbs;
    row["read_1gib_gbs"] = gib_gbs;
    row["steps"] = steps;
    row["repeats"] = repeats;
    row["checksum"] = sink % 1000;  // keeps the reads
    if (!out.Append(row)) return absl::InternalError("cannot write " + out.path());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = chunkattn::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "chunkattn-linear-bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
