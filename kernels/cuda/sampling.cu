// LaunchSample (layers.h): SampleRow (sample_row.h) as one thread block per
// sample, its collectives block-wide. Built without --use_fast_math (see
// CMakeLists.txt): the weights must be the CPU Sampler's bits, denormals
// included.
//
// Every collective passes a __syncthreads() before its first shared-memory
// write, so the scratch of the previous one is no longer read when it is
// written again.
#include <climits>
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/layers.h"
#include "kernels/cuda/sample_row.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace chunkattn::cuda {
namespace {

constexpr int kSampleThreads = 512;
constexpr int kWarps = kSampleThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

struct SampleShared {
  unsigned long long mass[256];
  int counts[256];
  double f64[32];
  unsigned long long u64[32];
  float f32[32];
  int i32[32];
  int result;
};

// The collectives of SampleRow over one row, for the block's threads.
class BlockRowOps {
 public:
  // marks: the history bitmap in shared memory; mask: the sample's mask
  // words in global memory (a warp's 32 consecutive tokens read one word),
  // or null.
  __device__ BlockRowOps(const float* row, int size, const uint32_t* marks, const uint32_t* mask, int mask_words,
                         SampleShared* s)
      : row_(row), size_(size), marks_(marks), mask_(mask), mask_words_(mask_words), s_(s) {}

  __device__ int size() const { return size_; }
  __device__ float Logit(int i) const { return row_[i]; }
  __device__ bool Allowed(int i) const { return sample_row_internal::MaskAllows(mask_, mask_words_, i); }
  __device__ bool Marked(int i) const { return (marks_[i >> 5] >> (i & 31)) & 1u; }

  template <typename F>
  __device__ float Max(F f) {
    float m = -INFINITY;
    for (int i = threadIdx.x; i < size_; i += kSampleThreads) m = fmaxf(m, f(i));
    __syncthreads();
    return BlockMax(m, s_->f32);
  }
  template <typename F>
  __device__ double SumF64(F f) {
    double sum = 0;
    for (int i = threadIdx.x; i < size_; i += kSampleThreads) sum += f(i);
    __syncthreads();
    return BlockSum(sum, s_->f64);
  }
  template <typename F>
  __device__ uint64_t SumU64(F f) {
    unsigned long long sum = 0;
    for (int i = threadIdx.x; i < size_; i += kSampleThreads) sum += f(i);
    __syncthreads();
    return BlockSum(sum, s_->u64);
  }
  template <typename F>
  __device__ RowArgMax ArgMax(F f) {
    float best = -INFINITY;
    int best_id = INT_MAX;
    for (int i = threadIdx.x; i < size_; i += kSampleThreads) {
      const float x = f(i);
      if (x > best) {  // a thread's items come in increasing id: keeps its first maximum
        best = x;
        best_id = i;
      }
    }
    __syncthreads();
    BlockArgMax(best, best_id, s_->f32, s_->i32);
    return {best, best_id};
  }
  template <bool kMass, typename F>
  __device__ void Histogram(F f) {
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kSampleThreads) {
      s_->counts[b] = 0;
      s_->mass[b] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < size_; i += kSampleThreads) {
      const RowBin x = f(i);
      if (x.bin < 0) continue;
      atomicAdd(&s_->counts[x.bin], 1);
      if (kMass && x.mass != 0) atomicAdd(&s_->mass[x.bin], static_cast<unsigned long long>(x.mass));
    }
    __syncthreads();
  }
  __device__ int64_t count(int b) const { return s_->counts[b]; }
  __device__ uint64_t mass(int b) const { return s_->mass[b]; }

  // Tiles of kSampleThreads ids in order; a ballot ranks each tile's matches.
  template <typename P>
  __device__ int NthId(P pred, int64_t nth) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t base = 0;  // matches before the tile
    for (int tile = 0; tile < size_; tile += kSampleThreads) {
      const int i = tile + static_cast<int>(threadIdx.x);
      const bool match = i < size_ && pred(i);
      const unsigned ballot = __ballot_sync(kFull, match);
      __syncthreads();
      if (lane == 0) s_->i32[warp] = __popc(ballot);
      __syncthreads();
      int before_warp = 0, in_tile = 0;
      for (int w = 0; w < kWarps; ++w) {
        const int c = s_->i32[w];
        before_warp += w < warp ? c : 0;
        in_tile += c;
      }
      if (match && base + before_warp + __popc(ballot & ((1u << lane) - 1u)) == nth) s_->result = i;
      base += in_tile;
      if (base > nth) break;  // block-uniform
    }
    __syncthreads();
    return base > nth ? s_->result : -1;
  }

  // Tiles in order, an inclusive block scan of the masses per tile.
  template <typename F>
  __device__ int DrawId(F f, uint64_t target) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned long long base = 0;  // mass before the tile
    int last = -1;                // this thread's last id of nonzero mass
    for (int tile = 0; tile < size_; tile += kSampleThreads) {
      const int i = tile + static_cast<int>(threadIdx.x);
      const unsigned long long w = i < size_ ? static_cast<unsigned long long>(f(i)) : 0ull;
      if (w != 0) last = i;
      unsigned long long cum = w;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long up = __shfl_up_sync(kFull, cum, o);
        if (lane >= o) cum += up;
      }
      __syncthreads();
      if (lane == 31) s_->u64[warp] = cum;
      __syncthreads();
      unsigned long long before_warp = 0, in_tile = 0;
      for (int k = 0; k < kWarps; ++k) {
        const unsigned long long c = s_->u64[k];
        before_warp += k < warp ? c : 0ull;
        in_tile += c;
      }
      cum += base + before_warp;
      // Running masses only grow: one token crosses the target.
      if (w != 0 && cum > target && cum - w <= target) s_->result = i;
      base += in_tile;
      if (base > target) break;  // block-uniform
    }
    __syncthreads();
    if (base > target) return s_->result;
    // Unreached (no mass): the last token of nonzero mass, if any.
    last = __reduce_max_sync(kFull, last);
    if (lane == 0) s_->i32[warp] = last;
    __syncthreads();
    return __reduce_max_sync(kFull, lane < kWarps ? s_->i32[lane] : -1);
  }

 private:
  const float* row_;
  int size_;
  const uint32_t* marks_;
  const uint32_t* mask_;
  int mask_words_;
  SampleShared* s_;
};

__global__ void __launch_bounds__(kSampleThreads)
    SampleKernel(const float* logits, int64_t rows, int vocab, int64_t row_offset, const SampleRowParams* params,
                 const int32_t* history, const uint32_t* masks, int32_t* token, float* logprob) {
  extern __shared__ uint32_t marks[];  // (vocab + 31) / 32 words when history != nullptr
  __shared__ SampleShared shared;
  const SampleRowParams p = params[blockIdx.x];
  const int64_t r = int64_t{p.row} - row_offset;
  // Contract breaches the host should have caught give the bad-row answer
  // rather than touching memory out of bounds.
  const bool masked = p.mask_begin >= 0;
  if (r < 0 || r >= rows || (p.penalty != 1.0f && history == nullptr) ||
      (masked && (masks == nullptr || p.mask_words < 0 || p.mask_words > (vocab + 31) / 32))) {
    if (threadIdx.x == 0) {
      token[blockIdx.x] = -1;
      logprob[blockIdx.x] = NAN;
    }
    return;
  }
  if (p.penalty != 1.0f) {
    const int words = (vocab + 31) / 32;
    for (int w = threadIdx.x; w < words; w += kSampleThreads) marks[w] = 0;
    __syncthreads();
    for (int k = p.history_begin + static_cast<int>(threadIdx.x); k < p.history_end; k += kSampleThreads) {
      const int32_t t = history[k];
      atomicOr(&marks[t >> 5], 1u << (t & 31));
    }
    __syncthreads();
  }
  BlockRowOps ops(logits + r * vocab, vocab, marks, masked ? masks + p.mask_begin : nullptr, p.mask_words, &shared);
  const SampleRowResult out = SampleRow(ops, p);
  if (threadIdx.x == 0) {
    token[blockIdx.x] = out.token;
    logprob[blockIdx.x] = out.logprob;
  }
}

}  // namespace

cudaError_t LaunchSample(const float* logits, int64_t rows, int vocab, int64_t row_offset,
                         const SampleRowParams* params, int64_t samples, const int32_t* history,
                         const uint32_t* masks, int32_t* token, float* logprob, cudaStream_t stream) {
  if (rows < 0 || samples < 0 || samples > INT32_MAX || vocab <= 0 || vocab > kMaxSampleVocab ||
      (history != nullptr && vocab > kMaxPenaltyVocab)) {
    return cudaErrorInvalidValue;
  }
  if (samples == 0) return cudaSuccess;
  if (logits == nullptr || params == nullptr || token == nullptr || logprob == nullptr) return cudaErrorInvalidValue;
  const size_t marks_bytes = history == nullptr ? 0 : static_cast<size_t>((vocab + 31) / 32) * 4;
  SampleKernel<<<static_cast<unsigned>(samples), kSampleThreads, marks_bytes, stream>>>(
      logits, rows, vocab, row_offset, params, history, masks, token, logprob);
  return cudaGetLastError();
}

}  // namespace chunkattn::cuda
