// The layer primitives of layers.h. All are memory-bound: one block per row
// where the row needs a reduction (RMSNorm, greedy) and a (rows, column
// blocks) grid for the elementwise ones, 16-byte accesses where the sizes and
// pointers allow them. The library is built with --use_fast_math, so the
// precision-sensitive operations below name their IEEE intrinsics.
#include "kernels/cuda/layers.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/api/attention.h"  // KvPoolView (its Abseil includes are declarations only here)
#include "kernels/api/kv_layout.h"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace chunkattn::cuda {
namespace {

constexpr int64_t kMaxRows = INT32_MAX;  // rows are grid.x
constexpr int64_t kMaxGridY = 65535;
constexpr int kEmbedThreads = 256;
constexpr int kNormMaxThreads = 512;
constexpr int kNormVecsPerThread = kMaxNormHidden / 4 / kNormMaxThreads;  // float4s of a row held per thread
constexpr int kRopeThreads = 128;
constexpr int kQkNormThreads = 128;  // four heads per block, a warp each
constexpr int kSwiGluThreads = 256;
constexpr int kGreedyThreads = 512;
constexpr int kMaxVocab = 1 << 30;

static_assert(kNormVecsPerThread * 4 * kNormMaxThreads == kMaxNormHidden, "a row of kMaxNormHidden fits");

// N elements of T as one aligned access (ld/st.global.v2/v4).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ Vec<T, N> Load(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
template <int N, typename T>
__device__ __forceinline__ void Store(T* p, const Vec<T, N>& x) {
  *reinterpret_cast<Vec<T, N>*>(p) = x;
}

// exp(x) within about 3 ulp (flushed to 0 below 2^-126; NaN gives 0). Under
// --use_fast_math expf is ex2.approx(x * log2(e)), whose error grows with
// |x| (the product's rounding: ~1e-5 relative at |x| = 80); here ex2 only
// sees the reduced argument: x = n ln2 + r (Cody-Waite, |r| <= ln2 / 2).
__device__ __forceinline__ float PreciseExp(float x) {
  x = fminf(fmaxf(x, -104.0f), 89.0f);  // exp is 0 / +inf in fp32 beyond
  const float n = rintf(x * 1.44269504088896341f);
  float r = fmaf(n, -0.693359375f, x);  // ln2 = 0.693359375 - 2.12194440e-4, the first part exact in n
  r = fmaf(n, 2.12194440e-4f, r);
  return ldexpf(exp2f(r * 1.44269504088896341f), static_cast<int>(n));
}

// x[r, :] = float(table[tokens[r], :]); eight elements (16 bytes) per step.
template <typename T>
__global__ void __launch_bounds__(kEmbedThreads)
    EmbedKernel(const T* table, const int32_t* tokens, int hidden, float* x) {
  const T* const src = table + int64_t{tokens[blockIdx.x]} * hidden;
  float* const dst = x + int64_t{blockIdx.x} * hidden;
  for (int i = threadIdx.x * 8; i < hidden; i += blockDim.x * 8) {
    const Vec<T, 8> in = Load<8>(src + i);
    Vec<float, 4> lo, hi;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      lo.v[e] = ToFloat(in.v[e]);
      hi.v[e] = ToFloat(in.v[4 + e]);
    }
    Store(dst + i, lo);
    Store(dst + i + 4, hi);
  }
}

// One block per output row; the row (y = x + delta) stays in registers
// between the sum of squares and the scaling: float4 number v of the row is
// held by thread v % blockDim.x, as y[v / blockDim.x].
template <typename T>
__global__ void __launch_bounds__(kNormMaxThreads)
    AddRmsNormKernel(float* x, const float* delta, const int32_t* gather, const float* weight, int hidden, float eps,
                     T* out) {
  __shared__ float partial[32];
  const int64_t i = blockIdx.x;
  const int64_t r = gather != nullptr ? int64_t{gather[i]} : i;
  float* const xr = x + r * hidden;
  const float* const dr = delta != nullptr ? delta + r * hidden : nullptr;
  const bool write_back = gather == nullptr && delta != nullptr;
  const int vecs = hidden / 4;
  Vec<float, 4> y[kNormVecsPerThread];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormVecsPerThread; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v < vecs) {
      y[k] = Load<4>(xr + 4 * v);
      if (dr != nullptr) {
        const Vec<float, 4> d = Load<4>(dr + 4 * v);
#pragma unroll
        for (int e = 0; e < 4; ++e) y[k].v[e] += d.v[e];
        if (write_back) Store(xr + 4 * v, y[k]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) ss += y[k].v[e] * y[k].v[e];
    }
  }
  ss = BlockSum(ss, partial);
  // The CPU's 1.0f / std::sqrt(sum / n + eps), each step IEEE-rounded (fast
  // math would otherwise make the division and the square root approximate).
  const float inv = __frcp_rn(__fsqrt_rn(__fdiv_rn(ss, static_cast<float>(hidden)) + eps));
  T* const o = out + i * hidden;
#pragma unroll
  for (int k = 0; k < kNormVecsPerThread; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v < vecs) {
      const Vec<float, 4> w = Load<4>(weight + 4 * v);
      Vec<T, 4> res;
#pragma unroll
      for (int e = 0; e < 4; ++e) res.v[e] = FromFloat<T>(w.v[e] * (y[k].v[e] * inv));
      Store(o + 4 * v, res);
    }
  }
}

// Grid (rows, head blocks): warp w of block y normalizes head y * 4 + w of
// its row, the first `covered` heads (q and k; v too when there is a bias to
// add). Each lane holds dims lane, lane + 32, ... and re-reads them for the
// scaling (a head is 1 KiB at most: it stays in L1).
__global__ void __launch_bounds__(kQkNormThreads)
    QkNormKernel(float* qkv, const float* bias, const float* q_weight, const float* k_weight, int num_heads,
                 int num_kv_heads, int head_dim, int covered, float eps) {
  const int lane = threadIdx.x & 31;
  const int head = blockIdx.y * (kQkNormThreads / 32) + (threadIdx.x >> 5);
  if (head >= covered) return;  // whole warps: the shuffles below see every lane
  const int width = (num_heads + 2 * num_kv_heads) * head_dim;
  float* const x = qkv + int64_t{blockIdx.x} * width + head * head_dim;
  const float* const b = bias != nullptr ? bias + head * head_dim : nullptr;
  if (head >= num_heads + num_kv_heads) {  // a v head: only its bias
    for (int i = lane; i < head_dim; i += 32) x[i] += b[i];
    return;
  }
  const float* const w = head < num_heads ? q_weight : k_weight;
  float ss = 0.0f;
  for (int i = lane; i < head_dim; i += 32) {
    const float y = b != nullptr ? x[i] + b[i] : x[i];
    ss += y * y;
  }
  ss = WarpSum(ss);
  // The CPU's 1.0f / std::sqrt(sum / n + eps), each step IEEE-rounded.
  const float inv = __frcp_rn(__fsqrt_rn(__fdiv_rn(ss, static_cast<float>(head_dim)) + eps));
  for (int i = lane; i < head_dim; i += 32) {
    const float y = b != nullptr ? x[i] + b[i] : x[i];
    x[i] = w[i] * (y * inv);
  }
}

struct RopeParams {
  const float* qkv;  // (rows, heads * head_dim)
  const float* bias;
  const float* cos;  // (max_positions, half)
  const float* sin;
  const int32_t* positions;
  const int64_t* slots;
  void* q_out;   // (rows, num_heads, head_dim)
  void* pool_k;  // (num_chunks, num_kv_heads, chunk_size, head_dim)
  void* pool_v;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int chunk_size;
  int log2_chunk;
};

// Grid (rows, column blocks). Thread j of a row owns dims [i, i + kVec) and
// [i + half, i + half + kVec) of head j / (half / kVec), i = (j % (half / kVec)) * kVec,
// heads numbered q, then k, then v as in the qkv row.
template <typename T, int kVec>
__global__ void __launch_bounds__(kRopeThreads) RopeAppendKernel(const RopeParams p) {
  const int half = p.head_dim / 2;
  const int per_head = half / kVec;
  const int heads = p.num_heads + 2 * p.num_kv_heads;
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= heads * per_head) return;
  const int64_t r = blockIdx.x;
  const int head = j / per_head;
  const int i = (j - head * per_head) * kVec;
  const int col = head * p.head_dim + i;  // in the qkv row
  const float* const src = p.qkv + r * heads * p.head_dim + col;
  Vec<float, kVec> a = Load<kVec>(src), b = Load<kVec>(src + half);
  if (p.bias != nullptr) {
    const Vec<float, kVec> ba = Load<kVec>(p.bias + col), bb = Load<kVec>(p.bias + col + half);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      a.v[e] += ba.v[e];
      b.v[e] += bb.v[e];
    }
  }
  if (head < p.num_heads + p.num_kv_heads) {  // q or k: rotate
    const int64_t t = int64_t{p.positions[r]} * half + i;
    const Vec<float, kVec> c = Load<kVec>(p.cos + t), s = Load<kVec>(p.sin + t);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float ae = a.v[e], be = b.v[e];
      a.v[e] = ae * c.v[e] - be * s.v[e];
      b.v[e] = be * c.v[e] + ae * s.v[e];
    }
  }
  T* dst;
  if (head < p.num_heads) {
    dst = static_cast<T*>(p.q_out) + (r * p.num_heads + head) * p.head_dim + i;
  } else {
    const int64_t slot = p.slots[r];
    if (slot < 0) return;  // a padding row: no K/V
    int kv_head = head - p.num_heads;
    void* pool = p.pool_k;
    if (kv_head >= p.num_kv_heads) {
      kv_head -= p.num_kv_heads;
      pool = p.pool_v;
    }
    const int64_t chunk = slot >> p.log2_chunk;
    const int64_t in_chunk = slot & (p.chunk_size - 1);
    dst = static_cast<T*>(pool) + ((chunk * p.num_kv_heads + kv_head) * p.chunk_size + in_chunk) * p.head_dim + i;
  }
  Vec<T, kVec> oa, ob;
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    oa.v[e] = FromFloat<T>(a.v[e]);
    ob.v[e] = FromFloat<T>(b.v[e]);
  }
  Store(dst, oa);
  Store(dst + half, ob);
}

// Grid (rows, column blocks); kVec consecutive columns per thread.
template <typename T, int kVec>
__global__ void __launch_bounds__(kSwiGluThreads) SwiGluKernel(const T* gate_up, int inter, T* out) {
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * kVec;
  if (c >= inter) return;
  const int64_t r = blockIdx.x;
  const T* const gp = gate_up + r * 2 * inter + c;
  const Vec<T, kVec> g = Load<kVec>(gp), u = Load<kVec>(gp + inter);
  Vec<T, kVec> o;
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const float gf = ToFloat(g.v[e]);
    // IEEE division: fast math's __fdividef returns 0 for denominators
    // above 2^126, i.e. for g < -87.
    o.v[e] = FromFloat<T>(__fdiv_rn(gf, 1.0f + PreciseExp(-gf)) * ToFloat(u.v[e]));
  }
  Store(out + r * inter + c, o);
}

// Calls f(i, x) for this thread's logits x = row[i], in increasing i.
template <typename F>
__device__ __forceinline__ void ForEachInRow(const float* row, int n, bool vec4, F f) {
  if (vec4) {
    for (int i = threadIdx.x * 4; i < n; i += blockDim.x * 4) {
      const Vec<float, 4> x = Load<4>(row + i);
#pragma unroll
      for (int e = 0; e < 4; ++e) f(i + e, x.v[e]);
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) f(i, row[i]);
  }
}

// One block per row, two passes over it: the argmax (a strict > never picks
// NaN, and keeps a thread's first maximum), then the sum of exp(x - max).
__global__ void __launch_bounds__(kGreedyThreads)
    GreedyKernel(const float* logits, int vocab, bool vec4, int32_t* token, float* logprob) {
  __shared__ float smem_v[32];
  __shared__ int smem_id[32];
  __shared__ double smem_sum[32];
  const float* const row = logits + int64_t{blockIdx.x} * vocab;
  float best = -INFINITY;
  int best_id = INT_MAX;
  ForEachInRow(row, vocab, vec4, [&](int i, float x) {
    if (x > best) {
      best = x;
      best_id = i;
    }
  });
  BlockArgMax(best, best_id, smem_v, smem_id);
  if (!(best > -INFINITY && best < INFINITY)) {  // a +inf logit, or none finite (block-uniform)
    if (threadIdx.x == 0) {
      token[blockIdx.x] = -1;
      logprob[blockIdx.x] = NAN;
    }
    return;
  }
  double sum = 0.0;
  ForEachInRow(row, vocab, vec4, [&](int, float x) {
    const float d = x - best;
    if (d > -104.0f) sum += PreciseExp(d);  // false for NaN and -inf logits; exp is 0 below anyway
  });
  sum = BlockSum(sum, smem_sum);
  if (threadIdx.x == 0) {
    token[blockIdx.x] = best_id;
    // logit[token] == max, so the log-softmax is -log(sum) (double log: fast
    // math only touches fp32 functions).
    logprob[blockIdx.x] = static_cast<float>(-log(sum));
  }
}

bool IsStorageType(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

bool Aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Threads of a one-block-per-row launch: `work` items rounded up to whole
// warps, at most `max_threads`.
int RowThreads(int64_t work, int max_threads) {
  const int64_t t = (work + 31) / 32 * 32;
  return t < max_threads ? static_cast<int>(t) : max_threads;
}

// Calls f(T*) with a null pointer of the storage type T of `dtype`.
template <typename F>
cudaError_t DispatchStorage(DType dtype, F&& f) {
  if (dtype == DType::kFloat16) return f(static_cast<__half*>(nullptr));
  if (dtype == DType::kBFloat16) return f(static_cast<__nv_bfloat16*>(nullptr));
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchEmbed(DType dtype, const void* table, const int32_t* tokens, int64_t rows, int hidden, float* x,
                        cudaStream_t stream) {
  if (!IsStorageType(dtype) || rows < 0 || rows > kMaxRows || hidden <= 0 || hidden % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (table == nullptr || tokens == nullptr || x == nullptr || !Aligned(table, 16) || !Aligned(x, 16)) {
    return cudaErrorInvalidValue;
  }
  return DispatchStorage(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    EmbedKernel<T><<<static_cast<unsigned>(rows), RowThreads(hidden / 8, kEmbedThreads), 0, stream>>>(
        static_cast<const T*>(table), tokens, hidden, x);
    return cudaGetLastError();
  });
}

cudaError_t LaunchAddRmsNorm(DType dtype, float* x, const float* delta, const int32_t* gather, const float* weight,
                             int64_t rows, int hidden, float eps, void* out, cudaStream_t stream) {
  if (!IsStorageType(dtype) || rows < 0 || rows > kMaxRows || hidden <= 0 || hidden % 8 != 0 ||
      hidden > kMaxNormHidden) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (x == nullptr || weight == nullptr || out == nullptr || !Aligned(x, 16) || !Aligned(delta, 16) ||
      !Aligned(weight, 16) || !Aligned(out, 16)) {
    return cudaErrorInvalidValue;
  }
  // Up to 1024 float4s (hidden 4096) on 256 threads, above on 512: at most
  // kNormVecsPerThread per thread.
  const int vecs = hidden / 4;
  const int threads = vecs <= 1024 ? RowThreads(vecs, 256) : kNormMaxThreads;
  return DispatchStorage(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    AddRmsNormKernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, delta, gather, weight, hidden, eps,
                                                                             static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t LaunchQkNorm(float* qkv, const float* bias, const float* q_weight, const float* k_weight, int64_t rows,
                         int num_heads, int num_kv_heads, int head_dim, float eps, cudaStream_t stream) {
  if (rows < 0 || rows > kMaxRows || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || head_dim > 256) {
    return cudaErrorInvalidValue;
  }
  const int64_t heads = int64_t{num_heads} + 2 * int64_t{num_kv_heads};
  if (heads * head_dim > INT32_MAX) return cudaErrorInvalidValue;  // column indices are int
  if (rows == 0) return cudaSuccess;
  if (qkv == nullptr || q_weight == nullptr || k_weight == nullptr) return cudaErrorInvalidValue;
  const int64_t covered = bias != nullptr ? heads : int64_t{num_heads} + num_kv_heads;
  const int64_t blocks_y = (covered + kQkNormThreads / 32 - 1) / (kQkNormThreads / 32);
  if (blocks_y > kMaxGridY) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(blocks_y));
  QkNormKernel<<<grid, kQkNormThreads, 0, stream>>>(qkv, bias, q_weight, k_weight, num_heads, num_kv_heads, head_dim,
                                                    static_cast<int>(covered), eps);
  return cudaGetLastError();
}

cudaError_t LaunchRopeAppend(DType dtype, const float* qkv, const float* bias, const float* cos_table,
                             const float* sin_table, const int32_t* positions, const int64_t* slots, int64_t rows,
                             int num_heads, int num_kv_heads, int head_dim, const KvPoolView& kv, void* q_out,
                             cudaStream_t stream) {
  if (!IsStorageType(dtype) || kv.dtype != dtype || rows < 0 || rows > kMaxRows || num_heads <= 0 ||
      num_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim > 256 || kv.num_kv_heads != num_kv_heads ||
      kv.head_dim != head_dim || kv.chunk_size <= 0 || (kv.chunk_size & (kv.chunk_size - 1)) != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t heads = int64_t{num_heads} + 2 * int64_t{num_kv_heads};
  if (heads * head_dim > INT32_MAX) return cudaErrorInvalidValue;  // column indices are int
  if (rows == 0) return cudaSuccess;
  if (qkv == nullptr || cos_table == nullptr || sin_table == nullptr || positions == nullptr || slots == nullptr ||
      q_out == nullptr || kv.k == nullptr || kv.v == nullptr) {
    return cudaErrorInvalidValue;
  }
  // Four dims per thread when every access is then aligned: fp32 rows and
  // head offsets are multiples of 8 elements (32 bytes), dim offsets of 4
  // (16 bytes of fp32, 8 of T).
  const bool vec = head_dim % 8 == 0 && Aligned(qkv, 16) && Aligned(bias, 16) && Aligned(cos_table, 16) &&
                   Aligned(sin_table, 16) && Aligned(q_out, 8) && Aligned(kv.k, 8) && Aligned(kv.v, 8);
  const int64_t per_row = heads * (head_dim / 2 / (vec ? 4 : 1));
  const int64_t blocks_y = (per_row + kRopeThreads - 1) / kRopeThreads;
  if (blocks_y > kMaxGridY) return cudaErrorInvalidValue;
  RopeParams p;
  p.qkv = qkv;
  p.bias = bias;
  p.cos = cos_table;
  p.sin = sin_table;
  p.positions = positions;
  p.slots = slots;
  p.q_out = q_out;
  p.pool_k = kv.k;
  p.pool_v = kv.v;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  p.chunk_size = kv.chunk_size;
  p.log2_chunk = Log2ChunkSize(kv.chunk_size);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(blocks_y));
  return DispatchStorage(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    if (vec) {
      RopeAppendKernel<T, 4><<<grid, kRopeThreads, 0, stream>>>(p);
    } else {
      RopeAppendKernel<T, 1><<<grid, kRopeThreads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchSwiGlu(DType dtype, const void* gate_up, int64_t rows, int inter, void* out, cudaStream_t stream) {
  if (!IsStorageType(dtype) || rows < 0 || rows > kMaxRows || inter <= 0 || inter > INT32_MAX / 2) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (gate_up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  // Eight columns (16 bytes) per thread when the rows, the up half and the
  // outputs all start 16-byte aligned.
  const bool vec = inter % 8 == 0 && Aligned(gate_up, 16) && Aligned(out, 16);
  const int64_t per_row = vec ? inter / 8 : inter;
  const int64_t blocks_y = (per_row + kSwiGluThreads - 1) / kSwiGluThreads;
  if (blocks_y > kMaxGridY) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(blocks_y));
  return DispatchStorage(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    const T* const in = static_cast<const T*>(gate_up);
    T* const o = static_cast<T*>(out);
    if (vec) {
      SwiGluKernel<T, 8><<<grid, kSwiGluThreads, 0, stream>>>(in, inter, o);
    } else {
      SwiGluKernel<T, 1><<<grid, kSwiGluThreads, 0, stream>>>(in, inter, o);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchGreedy(const float* logits, int64_t rows, int vocab, int32_t* token, float* logprob,
                         cudaStream_t stream) {
  if (rows < 0 || rows > kMaxRows || vocab <= 0 || vocab > kMaxVocab) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || token == nullptr || logprob == nullptr) return cudaErrorInvalidValue;
  const bool vec4 = vocab % 4 == 0 && Aligned(logits, 16);
  GreedyKernel<<<static_cast<unsigned>(rows), kGreedyThreads, 0, stream>>>(logits, vocab, vec4, token, logprob);
  return cudaGetLastError();
}

}  // namespace chunkattn::cuda
