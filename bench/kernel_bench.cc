// chunkattn-kernel-bench: decode self-attention latency on the ChunkAttention
// paper's Table 3 workload. `batch` sequences of `np` prompt tokens each, of
// which the first `ns` are the same for all (a shared system prompt); one
// decode step's attention for one layer. The (C, i, j) context comes from the
// real PrefixForest, so the shared prefix is physically shared as in serving.
//
//   chunkattn-kernel-bench --np 2048 --ns 2048 --batch 32 --heads 32
//   chunkattn-kernel-bench --grid paper --heads 8 --json bench/results/cpu-$(hostname).json
//
// --device cuda runs the same workloads on GPU 0 (fp16/bf16): CUDA-event
// timings of the launches alone, median of --repeat, with L2 flushed (a
// buffer four times its size rewritten) before every run; the floor is the
// fewest bytes at the device-to-device copy bandwidth measured in the same
// run. Outputs are checked against the CPU TPP kernel on the same inputs.
//
// Impls: tpp (two-phase partition), seq (every sequence reads all of its
// chunks, shared ones included: the paper's PagedAttention*), naive (dense
// per-sequence KV copies, full score rows materialized). Per configuration:
// median latency over --repeat runs, the fewest bytes the work must read
// (shared KV once, private KV once, Q and O), the achieved GB/s, the floor
// (those bytes at this machine's read bandwidth, measured in the same run)
// and the speedup over seq.
//
// --json is rewritten as each configuration completes. A configuration that
// fails (an error, or impls that disagree beyond --agree_tol) is written as
// failed rows ("ok": false, "error") and the run goes on; the exit status
// is then 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "bench/bench_util.h"
#include "kernels/api/attention.h"
#include "kernels/cpu/attention.h"
#include "nlohmann/json.hpp"
#include "services/core/prefix_forest.h"
#if CHUNKATTN_BENCH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"
#endif

ABSL_FLAG(std::string, device, "cpu", "cpu | cuda");
ABSL_FLAG(std::string, impl, "all", "tpp | seq | naive | all (comma-separated list allowed)");
ABSL_FLAG(int, np, 2048, "prompt tokens per sequence (n_p)");
ABSL_FLAG(int, ns, 2048, "leading prompt tokens shared by every sequence (n_s <= n_p)");
ABSL_FLAG(int, batch, 32, "sequences decoded together (b)");
ABSL_FLAG(int, heads, 32, "query heads (h)");
ABSL_FLAG(int, kv_heads, 0, "KV heads (0 = heads, i.e. no GQA)");
ABSL_FLAG(int, head_dim, 128, "head dimension (d)");
ABSL_FLAG(int, chunk, 64, "tokens per chunk (c)");
ABSL_FLAG(std::string, dtype, "fp16", "KV storage: fp16 | bf16 | fp32");
ABSL_FLAG(int, repeat, 10, "timed runs per configuration (the median is reported)");
ABSL_FLAG(int, warmup, 2, "untimed runs first");
ABSL_FLAG(int, threads, 0, "CPU threads (0 = one per core)");
ABSL_FLAG(std::string, isa, "best", "CPU kernels: best | avx512 | avx2 | portable");
ABSL_FLAG(std::string, grid, "", "'paper': n_p in 1024/2048/4096 x n_s in 0/1024/2048/4096 (n_s <= n_p), "
                                 "b, h, d, c from the flags (paper: 32, 32, 128, 64)");
ABSL_FLAG(std::string, json, "",
          "write one JSON object per configuration and impl (a JSON array) here, rewritten as each completes");
ABSL_FLAG(double, agree_tol, 0,
          "largest |diff| allowed between impls (CPU: against the first; CUDA: against the CPU kernel); 0 = "
          "1e-3 on CPU, 2e-2 fp16 / 6e-2 bf16 on CUDA. A row over it is written as failed and the run goes on");
ABSL_FLAG(uint32_t, seed, 1, "data seed");

namespace chunkattn {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int np, ns, batch, heads, kv_heads, head_dim, chunk;
  DType dtype;
};

// One layer's KV pool and the context of `batch` sequences over it.
struct Workload {
  ChunkContext ctx;
  std::vector<uint16_t> k, v;  // fp16/bf16 storage, or fp32 viewed as 2x uint16
  KvPoolView view;
  std::vector<float> q;
};

// Cheap deterministic fill: a pool of GBs would take long with <random>.
struct XorShift {
  uint64_t s;
  float Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 23);  // [-1, 1)
  }
};

// Builds a configuration's workload, filling its pool on `pool`'s threads
// (the largest is 2.2 GB: one core takes 10 s; a GPU session has minutes).
// Each workload's context gets a version no earlier one had: a CudaAttention
// keeps its plan while the version is unchanged, and the forests of two
// configurations count versions alike.
absl::StatusOr<std::unique_ptr<Workload>> Build(const Config& cfg, uint32_t seed, ThreadPool& pool) {
  static uint64_t workloads_built = 0;
  const int c = cfg.chunk;
  PrefixForestOptions opt;
  opt.chunk_size = c;
  opt.num_chunks = (cfg.ns + c - 1) / c + cfg.batch * ((cfg.np - cfg.ns) / c + 2) + 4;
  ASSIGN_OR_RETURN(std::unique_ptr<PrefixForest> forest, PrefixForest::Create(opt));
  std::vector<TokenId> prompt(cfg.np);
  for (int s = 0; s < cfg.batch; ++s) {
    for (int i = 0; i < cfg.np; ++i) prompt[i] = i < cfg.ns ? i + 1 : 1000000 + s * cfg.np + i;
    RETURN_IF_ERROR(forest->Insert(prompt).status());
    forest->MarkAllComputed();  // so the next prompt matches the shared part
  }
  auto w = std::make_unique<Workload>();
  w->ctx = forest->Context();
  w->ctx.version = (++workloads_built << 32) + w->ctx.version;
  const int64_t elems = int64_t{opt.num_chunks} * cfg.kv_heads * c * cfg.head_dim;
  const int64_t words = elems * DTypeBytes(cfg.dtype) / 2;
  w->k.resize(words);
  w->v.resize(words);
  w->view.k = w->k.data();
  w->view.v = w->v.data();
  w->view.dtype = cfg.dtype;
  w->view.num_chunks = opt.num_chunks;
  w->view.num_kv_heads = cfg.kv_heads;
  w->view.chunk_size = c;
  w->view.head_dim = cfg.head_dim;
  // A fixed number of blocks, each with its own stream: the same values
  // whatever the thread count.
  constexpr int64_t kBlocks = 256;
  const int64_t per_block = (elems + kBlocks - 1) / kBlocks;
  pool.ParallelFor(kBlocks, [&](int64_t block, int) {
    XorShift rng{0x9e3779b97f4a7c15ull ^ seed ^ (static_cast<uint64_t>(block + 1) * 0xbf58476d1ce4e5b9ull)};
    for (int64_t i = block * per_block, end = std::min(elems, i + per_block); i < end; ++i) {
      StoreAs(cfg.dtype, w->view.k, i, rng.Next());
      StoreAs(cfg.dtype, w->view.v, i, rng.Next());
    }
  });
  XorShift rng{0x9e3779b97f4a7c15ull ^ seed};
  w->q.resize(int64_t{cfg.batch} * cfg.heads * cfg.head_dim);
  for (float& x : w->q) x = 2 * rng.Next();
  return w;
}

// Read bandwidth of this machine with `pool`'s threads: the median of 5 passes
// over a buffer far larger than the last-level cache.
double MeasureReadGBps(ThreadPool& pool) {
  const int64_t words = int64_t{1} << 26;  // 512 MiB
  std::vector<uint64_t> buf(words, 1);
  std::vector<uint64_t> sink(pool.num_threads());
  std::vector<double> gbps;
  const int64_t parts = pool.num_threads() * 8;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = Clock::now();
    pool.ParallelFor(parts, [&](int64_t p, int t) {
      const uint64_t* b = buf.data() + p * (words / parts);
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (int64_t i = 0; i < words / parts; i += 4) {
        a0 += b[i];
        a1 += b[i + 1];
        a2 += b[i + 2];
        a3 += b[i + 3];
      }
      sink[t] += a0 + a1 + a2 + a3;
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) gbps.push_back(words * 8 / s / 1e9);
  }
  if (sink[0] == 42) std::printf(" ");  // keep the loads
  return bench::Median(gbps);
}

struct Result {
  std::string impl;
  double median_us = 0, min_us = 0, max_diff = 0;
};

Result Summarize(const std::string& impl, const std::vector<double>& us) {
  Result r;
  r.impl = impl;
  r.median_us = bench::Median(us);
  r.min_us = *std::min_element(us.begin(), us.end());
  return r;
}

double SeqMedian(const std::vector<Result>& results) {
  for (const Result& r : results) {
    if (r.impl == "seq") return r.median_us;
  }
  return 0;
}

// Rows go to the --json file as each configuration completes; a
// configuration that fails is recorded as failed and the run goes on (the
// exit status is 1 at the end).
struct Report {
  nlohmann::json provenance;
  std::string device;
  bench::JsonArrayFile json;
  int failed_rows = 0;

  // The fields every row of `cfg` and `impl` starts with.
  nlohmann::json Head(const Config& cfg, const std::string& impl) const {
    nlohmann::json row = provenance;
    row["device"] = device;
    row["impl"] = impl;
    row["np"] = cfg.np;
    row["ns"] = cfg.ns;
    row["batch"] = cfg.batch;
    row["heads"] = cfg.heads;
    row["kv_heads"] = cfg.kv_heads;
    row["head_dim"] = cfg.head_dim;
    row["chunk"] = cfg.chunk;
    row["dtype"] = DTypeName(cfg.dtype);
    return row;
  }

  // A measured row; `fields` (an object) are its measurements, `tol` the
  // agreement it had to meet.
  void Measured(const Config& cfg, const Result& r, double tol, const nlohmann::json& fields) {
    const bool ok = r.max_diff <= tol;
    if (!ok) {
      ++failed_rows;
      std::fprintf(stderr, "%s disagrees: max |diff| %.3g > %.0e (np %d, ns %d)\n", r.impl.c_str(), r.max_diff, tol,
                   cfg.np, cfg.ns);
    }
    nlohmann::json row = Head(cfg, r.impl);
    row.update(fields);
    row["tolerance"] = tol;
    row["ok"] = ok;
    if (!ok) row["error"] = absl::StrFormat("max |diff| %.3g > %.3g", r.max_diff, tol);
    json.Append(std::move(row));
  }

  // A configuration that could not be measured: one failed row per impl.
  void Failed(const Config& cfg, const std::vector<std::string>& impls, const absl::Status& st) {
    std::printf("%6d %6d %5d %5d %4d %4d %5d FAILED: %s\n", cfg.np, cfg.ns, cfg.batch, cfg.heads, cfg.kv_heads,
                cfg.head_dim, cfg.chunk, st.ToString().c_str());
    for (const std::string& impl : impls) {
      ++failed_rows;
      nlohmann::json row = Head(cfg, impl);
      row["ok"] = false;
      row["error"] = st.ToString();
      json.Append(std::move(row));
    }
  }

  // The exit status.
  int Finish() {
    if (!json.path().empty()) std::printf("wrote %s (%zu rows)\n", json.path().c_str(), json.size());
    if (failed_rows > 0) std::fprintf(stderr, "%d rows failed\n", failed_rows);
    return failed_rows > 0 ? 1 : 0;
  }
};

// The largest |diff| allowed between outputs: --agree_tol, or `fallback`.
double AgreeTol(double fallback) {
  const double flag = absl::GetFlag(FLAGS_agree_tol);
  return flag > 0 ? flag : fallback;
}

// Times one configuration on the CPU and reports its rows. A non-OK status:
// nothing was measured.
absl::Status MeasureCpu(const Config& cfg, const std::vector<std::string>& impls, int repeat, int warmup,
                        double read_gbps, cpu::Isa isa, ThreadPool& pool, cpu::CpuAttention& attn,
                        Report& report) {
  ASSIGN_OR_RETURN(std::unique_ptr<Workload> built, Build(cfg, absl::GetFlag(FLAGS_seed), pool));
  Workload& w = *built;
  const AttentionShape shape{cfg.heads, cfg.kv_heads, cfg.head_dim, 0};
  ASSIGN_OR_RETURN(const DecodePlan plan, PlanDecode(w.ctx, w.view.num_chunks));
  const int64_t kv_token_bytes = int64_t{2} * cfg.kv_heads * cfg.head_dim * DTypeBytes(cfg.dtype);
  const int64_t min_bytes = (int64_t{cfg.ns} + int64_t{cfg.batch} * (cfg.np - cfg.ns)) * kv_token_bytes +
                            2 * static_cast<int64_t>(w.q.size()) * 4;
  // Every impl gets its own output; timed runs go round-robin over the
  // impls so that drift (frequency, neighbours on the host) hits all alike.
  const size_t ni = impls.size();
  std::vector<std::vector<float>> outs(ni, std::vector<float>(w.q.size(), NAN));
  std::vector<std::function<absl::Status()>> runs(ni);
  std::unique_ptr<cpu::DenseKv> dense;
  for (size_t k = 0; k < ni; ++k) {
    float* o = outs[k].data();
    if (impls[k] == "naive") {
      ASSIGN_OR_RETURN(cpu::DenseKv d, cpu::GatherDense(w.ctx, w.view));
      dense = std::make_unique<cpu::DenseKv>(std::move(d));
      runs[k] = [&, o] { return cpu::NaiveDecode(*dense, shape, w.q.data(), o, &pool, isa); };
    } else {
      const DecodeImpl di = impls[k] == "tpp" ? DecodeImpl::kTpp : DecodeImpl::kSequence;
      runs[k] = [&, di, o] { return attn.Decode(di, plan, w.ctx, w.view, shape, w.q.data(), o); };
    }
  }
  std::vector<std::vector<double>> us(ni);
  for (int i = 0; i < warmup + repeat; ++i) {
    for (size_t k = 0; k < ni; ++k) {
      const auto t0 = Clock::now();
      const absl::Status st = runs[k]();
      const double t = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      RETURN_IF_ERROR(st);
      if (i >= warmup) us[k].push_back(t);
    }
  }
  // All impls compute the same attention in fp32 over the same stored KV:
  // each is checked against the first.
  const double tol = AgreeTol(1e-3);
  std::vector<Result> results;
  for (size_t k = 0; k < ni; ++k) {
    Result r = Summarize(impls[k], us[k]);
    for (size_t i = 0; i < outs[k].size(); ++i) {
      const double d = std::fabs(double{outs[k][i]} - outs[0][i]);
      r.max_diff = std::isnan(d) ? INFINITY : std::max(r.max_diff, d);
    }
    results.push_back(r);
  }
  const double seq_us = SeqMedian(results);
  const double floor_us = min_bytes / (read_gbps * 1e3);
  for (const Result& r : results) {
    const double gbps = min_bytes / (r.median_us * 1e3);
    const double vs_seq = seq_us > 0 ? seq_us / r.median_us : 0;
    std::printf("%6d %6d %5d %5d %4d %4d %5d %-6s %12.1f %10.1f %8.1f %10.1f %8.2fx %10.2e\n", cfg.np, cfg.ns,
                cfg.batch, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.chunk, r.impl.c_str(), r.median_us,
                min_bytes / 1e6, gbps, floor_us, vs_seq, r.max_diff);
    report.Measured(cfg, r, tol,
                    {{"median_us", r.median_us},
                     {"min_us", r.min_us},
                     {"min_bytes", min_bytes},
                     {"gbps", gbps},
                     {"floor_us", floor_us},
                     {"read_gbps", read_gbps},
                     {"speedup_vs_seq", vs_seq},
                     {"max_diff_vs_first", r.max_diff},
                     {"repeat", repeat},
                     {"threads", pool.num_threads()},
                     {"context_version", w.ctx.version},
                     {"isa", cpu::IsaName(isa)}});
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

#if CHUNKATTN_BENCH_CUDA
// Setup before any configuration; the bench cannot run without it.
#define CUDA_OR_DIE(expr)                                                                  \
  do {                                                                                     \
    const cudaError_t e_ = (expr);                                                         \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                     \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

absl::StatusOr<cuda::DeviceBuffer> ToDevice(const void* host, size_t bytes) {
  ASSIGN_OR_RETURN(cuda::DeviceBuffer b, cuda::DeviceBuffer::Allocate(std::max<size_t>(bytes, 16)));
  if (bytes > 0) CUDA_RETURN_IF_ERROR(cudaMemcpy(b.get(), host, bytes, cudaMemcpyHostToDevice));
  return b;
}

// Device-to-device copy bandwidth (bytes read + written per second), median
// of 10 copies of 1 GiB.
double MeasureCopyGBps(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  absl::StatusOr<cuda::DeviceBuffer> a = cuda::DeviceBuffer::Allocate(bytes), b = cuda::DeviceBuffer::Allocate(bytes);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "copy bandwidth: %s\n", (a.ok() ? b.status() : a.status()).ToString().c_str());
    std::exit(1);
  }
  cudaEvent_t t0, t1;
  CUDA_OR_DIE(cudaEventCreate(&t0));
  CUDA_OR_DIE(cudaEventCreate(&t1));
  std::vector<double> gbps;
  for (int rep = 0; rep < 12; ++rep) {
    CUDA_OR_DIE(cudaEventRecord(t0, stream));
    CUDA_OR_DIE(cudaMemcpyAsync(b->get(), a->get(), bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_OR_DIE(cudaEventRecord(t1, stream));
    CUDA_OR_DIE(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, t0, t1));
    if (rep >= 2) gbps.push_back(2.0 * bytes / (ms * 1e6));
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return bench::Median(gbps);
}

// What every configuration on the GPU shares: one CudaAttention per impl
// (each keeps its own plan, so alternating impls never re-plan), the stream,
// the L2 flush buffer, the timing events and the CPU reference kernel.
struct CudaBench {
  std::vector<std::unique_ptr<cuda::CudaAttention>> attns;
  cudaStream_t stream = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  cuda::DeviceBuffer flush;
  size_t flush_bytes = 0;
  double copy_gbps = 0;
  ThreadPool* pool = nullptr;  // borrowed: workload fills and the CPU reference
  std::unique_ptr<cpu::CpuAttention> cpu_attn;

  ~CudaBench() {
    if (t0 != nullptr) cudaEventDestroy(t0);
    if (t1 != nullptr) cudaEventDestroy(t1);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

// Times one configuration on the GPU and reports its rows. A non-OK status:
// nothing was measured.
absl::Status MeasureCuda(const Config& cfg, const std::vector<std::string>& impls, int repeat, int warmup,
                         CudaBench& b, Report& report) {
  if (cfg.dtype == DType::kFloat32 || !cuda::HasAttendKernel(cfg.dtype, cfg.head_dim)) {
    return absl::InvalidArgumentError("--device cuda: needs --dtype fp16 or bf16 and --head_dim 64 or 128");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Workload> built, Build(cfg, absl::GetFlag(FLAGS_seed), *b.pool));
  Workload& w = *built;
  const AttentionShape shape{cfg.heads, cfg.kv_heads, cfg.head_dim, 0};
  // q as stored on the GPU; the CPU reference reads the same rounded values.
  std::vector<uint16_t> q_bits(w.q.size());
  for (size_t i = 0; i < w.q.size(); ++i) {
    StoreAs(cfg.dtype, q_bits.data(), static_cast<int64_t>(i), w.q[i]);
    w.q[i] = LoadAs(cfg.dtype, q_bits.data(), static_cast<int64_t>(i));
  }
  std::vector<float> want(w.q.size());
  ASSIGN_OR_RETURN(const DecodePlan cplan, PlanDecode(w.ctx, w.view.num_chunks));
  RETURN_IF_ERROR(b.cpu_attn->Decode(DecodeImpl::kTpp, cplan, w.ctx, w.view, shape, w.q.data(), want.data()));
  const size_t pool_bytes = w.k.size() * 2, q_bytes = q_bits.size() * 2;
  ASSIGN_OR_RETURN(const cuda::DeviceBuffer dk, ToDevice(w.k.data(), pool_bytes));
  ASSIGN_OR_RETURN(const cuda::DeviceBuffer dv, ToDevice(w.v.data(), pool_bytes));
  ASSIGN_OR_RETURN(const cuda::DeviceBuffer dq, ToDevice(q_bits.data(), q_bytes));
  KvPoolView view = w.view;
  view.k = dk.get();
  view.v = dv.get();
  const int64_t kv_token_bytes = int64_t{2} * cfg.kv_heads * cfg.head_dim * DTypeBytes(cfg.dtype);
  const int64_t min_bytes = (int64_t{cfg.ns} + int64_t{cfg.batch} * (cfg.np - cfg.ns)) * kv_token_bytes +
                            2 * static_cast<int64_t>(q_bytes);
  const size_t ni = impls.size();
  std::vector<cuda::DeviceBuffer> outs;
  std::vector<std::function<absl::Status()>> runs(ni);
  std::vector<int> items(ni, 0);
  cuda::DeviceBuffer nk, nv, nlen, nscores;
  cuda::NaiveParams np;
  for (size_t k = 0; k < ni; ++k) {
    ASSIGN_OR_RETURN(cuda::DeviceBuffer out, cuda::DeviceBuffer::Allocate(q_bytes));
    outs.push_back(std::move(out));
    void* o = outs.back().get();
    if (impls[k] == "naive") {
      ASSIGN_OR_RETURN(const cpu::DenseKv d, cpu::GatherDense(w.ctx, w.view));
      ASSIGN_OR_RETURN(nk, ToDevice(d.k.data(), d.k.size()));
      ASSIGN_OR_RETURN(nv, ToDevice(d.v.data(), d.v.size()));
      ASSIGN_OR_RETURN(nlen, ToDevice(d.len.data(), d.len.size() * 4));
      ASSIGN_OR_RETURN(nscores, cuda::DeviceBuffer::Allocate(size_t{4} * cfg.batch * cfg.heads * d.max_len));
      np.k = nk.get();
      np.v = nv.get();
      np.len = static_cast<const int32_t*>(nlen.get());
      np.num_seqs = cfg.batch;
      np.max_len = static_cast<int>(d.max_len);
      np.num_heads = cfg.heads;
      np.num_kv_heads = cfg.kv_heads;
      np.head_dim = cfg.head_dim;
      np.scale = shape.EffectiveScale();
      np.q = dq.get();
      np.o = o;
      np.scores = static_cast<float*>(nscores.get());
      runs[k] = [&np, &cfg, &b] {
        return cuda::CudaStatus(cuda::LaunchNaiveDecode(np, cfg.dtype, b.stream), "naive decode");
      };
    } else {
      // Planning and uploads happen once per context version (and a small
      // token-count upload per step), outside the timed launches.
      const DecodeImpl di = impls[k] == "tpp" ? DecodeImpl::kTpp : DecodeImpl::kSequence;
      cuda::CudaAttention* const attn = b.attns[k].get();
      RETURN_IF_ERROR(attn->PrepareDecode(di, w.ctx, view, shape, b.stream));
      items[k] = static_cast<int>(attn->decode_work()->items.size());
      runs[k] = [&, attn, o] { return attn->LaunchDecode(view, shape, dq.get(), o, b.stream); };
    }
  }
  std::vector<std::vector<double>> us(ni);
  for (int i = 0; i < warmup + repeat; ++i) {
    for (size_t k = 0; k < ni; ++k) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(outs[k].get(), 0xff, q_bytes, b.stream));
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b.flush.get(), i & 0xff, b.flush_bytes, b.stream));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(b.t0, b.stream));
      const absl::Status st = runs[k]();
      CUDA_RETURN_IF_ERROR(cudaEventRecord(b.t1, b.stream));
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b.t1));
      RETURN_IF_ERROR(st);
      float ms = 0;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, b.t0, b.t1));
      if (i >= warmup) us[k].push_back(ms * 1e3);
    }
  }
  const double tol = AgreeTol(cfg.dtype == DType::kFloat16 ? 2e-2 : 6e-2);
  std::vector<Result> results;
  for (size_t k = 0; k < ni; ++k) {
    Result r = Summarize(impls[k], us[k]);
    std::vector<uint16_t> bits(q_bits.size());
    CUDA_RETURN_IF_ERROR(cudaMemcpy(bits.data(), outs[k].get(), q_bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < bits.size(); ++i) {
      const double d = std::fabs(double{LoadAs(cfg.dtype, bits.data(), static_cast<int64_t>(i))} - want[i]);
      r.max_diff = std::isnan(d) ? INFINITY : std::max(r.max_diff, d);
    }
    results.push_back(r);
  }
  const double seq_us = SeqMedian(results);
  const double floor_us = min_bytes / (b.copy_gbps * 1e3);
  for (size_t k = 0; k < ni; ++k) {
    const Result& r = results[k];
    const double gbps = min_bytes / (r.median_us * 1e3);
    const double vs_seq = seq_us > 0 ? seq_us / r.median_us : 0;
    std::printf("%6d %6d %5d %5d %4d %4d %5d %-6s %12.1f %10.1f %8.1f %10.1f %8.2fx %10.2e %6d\n", cfg.np, cfg.ns,
                cfg.batch, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.chunk, r.impl.c_str(), r.median_us,
                min_bytes / 1e6, gbps, floor_us, vs_seq, r.max_diff, items[k]);
    report.Measured(cfg, r, tol,
                    {{"median_us", r.median_us},
                     {"min_us", r.min_us},
                     {"min_bytes", min_bytes},
                     {"gbps", gbps},
                     {"floor_us", floor_us},
                     {"copy_gbps", b.copy_gbps},
                     {"speedup_vs_seq", vs_seq},
                     {"max_diff_vs_cpu", r.max_diff},
                     {"repeat", repeat},
                     {"work_items", items[k]},
                     {"context_version", w.ctx.version},
                     {"l2_flushed", true}});
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

int RunCuda(const std::vector<Config>& configs, const std::vector<std::string>& impls, int repeat, int warmup,
            ThreadPool& pool, Report& report) {
  if (cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "--device cuda: no CUDA device visible\n");
    return 2;
  }
  CudaBench b;
  for (size_t k = 0; k < impls.size(); ++k) {
    absl::StatusOr<std::unique_ptr<cuda::CudaAttention>> a = cuda::CudaAttention::Create({});
    if (!a.ok()) {
      std::fprintf(stderr, "%s\n", a.status().ToString().c_str());
      return 1;
    }
    b.attns.push_back(std::move(*a));
  }
  CUDA_OR_DIE(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  CUDA_OR_DIE(cudaEventCreate(&b.t0));
  CUDA_OR_DIE(cudaEventCreate(&b.t1));
  int l2 = 0;
  CUDA_OR_DIE(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  b.flush_bytes = std::max<size_t>(size_t{4} * l2, 64 << 20);
  absl::StatusOr<cuda::DeviceBuffer> flush = cuda::DeviceBuffer::Allocate(b.flush_bytes);
  if (!flush.ok()) {
    std::fprintf(stderr, "L2 flush buffer: %s\n", flush.status().ToString().c_str());
    return 1;
  }
  b.flush = std::move(*flush);
  b.copy_gbps = MeasureCopyGBps(b.stream);
  b.pool = &pool;
  b.cpu_attn = std::make_unique<cpu::CpuAttention>(&pool);
  report.device = "cuda: " + cuda::DeviceDescription(0);
  std::printf("device: %s\ncopy bandwidth: %.1f GB/s (device-to-device, read + write; L2 %d MiB flushed per run)\n",
              report.device.c_str(), b.copy_gbps, l2 >> 20);
  std::printf("%6s %6s %5s %5s %4s %4s %5s %-6s %12s %10s %8s %10s %9s %10s %6s\n", "np", "ns", "batch", "heads",
              "kvh", "d", "chunk", "impl", "median_us", "min_MB", "GB/s", "floor_us", "vs_seq", "max_diff", "items");
  for (const Config& cfg : configs) {
    const absl::Status st = MeasureCuda(cfg, impls, repeat, warmup, b, report);
    if (!st.ok()) report.Failed(cfg, impls, st);
  }
  return report.Finish();
}
#endif  // CHUNKATTN_BENCH_CUDA

int Main(int argc, char** argv) {
  // Accept --kv-heads as well as --kv_heads (absl flags use underscores).
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> argp;
  for (std::string& a : args) {
    if (a.rfind("--", 0) == 0) {
      for (size_t i = 2; i < a.size() && a[i] != '='; ++i) {
        if (a[i] == '-') a[i] = '_';
      }
    }
    argp.push_back(a.data());
  }
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argp.data());
  if (rest.size() > 1) {
    std::fprintf(stderr, "unexpected argument: %s\n", rest[1]);
    return 2;
  }
  const std::string device = absl::GetFlag(FLAGS_device);
#if !CHUNKATTN_BENCH_CUDA
  if (device == "cuda") {
    std::fprintf(stderr, "--device cuda: this build has no CUDA kernels (nvcc was not found)\n");
    return 2;
  }
#endif
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "--device must be cpu or cuda\n");
    return 2;
  }
  const std::optional<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype) {
    std::fprintf(stderr, "--dtype must be fp16, bf16 or fp32\n");
    return 2;
  }
  std::vector<std::string> impls = absl::StrSplit(absl::GetFlag(FLAGS_impl), ',');
  if (impls == std::vector<std::string>{"all"}) impls = {"tpp", "seq", "naive"};
  for (const std::string& i : impls) {
    if (i != "tpp" && i != "seq" && i != "naive") {
      std::fprintf(stderr, "--impl: unknown '%s' (tpp, seq, naive, all)\n", i.c_str());
      return 2;
    }
  }
  const absl::StatusOr<cpu::Isa> parsed_isa = cpu::ParseIsa(absl::GetFlag(FLAGS_isa));
  if (!parsed_isa.ok()) {
    std::fprintf(stderr, "--isa: %s\n", std::string(parsed_isa.status().message()).c_str());
    return 2;
  }
  const cpu::Isa isa = *parsed_isa;
  const int repeat = absl::GetFlag(FLAGS_repeat), warmup = absl::GetFlag(FLAGS_warmup);
  if (repeat < 1 || warmup < 0) {
    std::fprintf(stderr, "--repeat must be >= 1 and --warmup >= 0\n");
    return 2;
  }

  Config base{absl::GetFlag(FLAGS_np),       absl::GetFlag(FLAGS_ns),    absl::GetFlag(FLAGS_batch),
              absl::GetFlag(FLAGS_heads),    absl::GetFlag(FLAGS_kv_heads), absl::GetFlag(FLAGS_head_dim),
              absl::GetFlag(FLAGS_chunk),    *dtype};
  if (base.kv_heads == 0) base.kv_heads = base.heads;
  std::vector<Config> configs;
  if (absl::GetFlag(FLAGS_grid) == "paper") {
    for (int np : {1024, 2048, 4096}) {
      for (int ns : {0, 1024, 2048, 4096}) {
        if (ns > np) continue;
        Config c = base;
        c.np = np;
        c.ns = ns;
        configs.push_back(c);
      }
    }
  } else if (!absl::GetFlag(FLAGS_grid).empty()) {
    std::fprintf(stderr, "--grid must be 'paper'\n");
    return 2;
  } else {
    configs.push_back(base);
  }
  for (const Config& c : configs) {
    const bool ok = c.np >= 1 && c.np <= (1 << 20) && c.ns >= 0 && c.ns <= c.np && c.batch >= 1 &&
                    c.batch <= 4096 && c.heads >= 1 && c.kv_heads >= 1 && c.heads % c.kv_heads == 0 &&
                    c.head_dim % 16 == 0 && c.head_dim >= 16 && c.head_dim <= kMaxHeadDim && IsValidChunkSize(c.chunk);
    if (!ok) {
      std::fprintf(stderr,
                   "invalid shape: need 0 <= ns <= np, batch in [1, 4096], heads a multiple of kv_heads, "
                   "head_dim a multiple of 16 up to %d, chunk a power of two in [16, 256]\n",
                   kMaxHeadDim);
      return 2;
    }
  }

  ThreadPool pool(absl::GetFlag(FLAGS_threads));
  Report report{bench::Provenance(argc, argv), "", bench::JsonArrayFile(absl::GetFlag(FLAGS_json))};
#if CHUNKATTN_BENCH_CUDA
  if (device == "cuda") return RunCuda(configs, impls, repeat, warmup, pool, report);
#endif
  const double bw = MeasureReadGBps(pool);
  report.device = absl::StrFormat("cpu: %s, %d threads, %s", bench::CpuModel(), pool.num_threads(),
                                  cpu::IsaName(isa));
  std::printf("device: %s\nread bandwidth: %.1f GB/s (median of 5 passes over 512 MiB)\n", report.device.c_str(),
              bw);
  if (!configs.empty() && absl::GetFlag(FLAGS_grid) == "paper") {
    std::printf("grid: paper Table 3 at b=%d h=%d kv_heads=%d d=%d c=%d %s (paper: b=32 h=32 d=128 c=64 fp16)\n",
                base.batch, base.heads, base.kv_heads, base.head_dim, base.chunk, DTypeName(base.dtype));
  }
  std::printf("%6s %6s %5s %5s %4s %4s %5s %-6s %12s %10s %8s %10s %9s %10s\n", "np", "ns", "batch", "heads",
              "kvh", "d", "chunk", "impl", "median_us", "min_MB", "GB/s", "floor_us", "vs_seq", "max_diff");
  cpu::CpuAttention attn(&pool, isa);
  for (const Config& cfg : configs) {
    const absl::Status st = MeasureCpu(cfg, impls, repeat, warmup, bw, isa, pool, attn, report);
    if (!st.ok()) report.Failed(cfg, impls, st);
  }
  return report.Finish();
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) { return chunkattn::Main(argc, argv); }
