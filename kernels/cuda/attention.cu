// The CUDA attention kernel (chunk-first, sequence-first and prefill work
// items alike), the partial-state merge and the KV append.
//
// One block of four warps runs one WorkItem at a time (a persistent grid
// walks the item list). The item's query rows (at most 64) are loaded once;
// its KV positions stream through shared memory in stages of 64 with
// cp.async (16-byte loads, double-buffered, XOR-swizzled so ldmatrix is free
// of bank conflicts). Each warp owns 16 query rows and a share of every
// stage: an item of 64 rows gives each warp all 64 positions; an item of a
// single GQA group gives each warp 16 positions, so a sequence-first item
// still runs four warps. S = Q K^T and O += P V are mma.sync m16n8k16 with
// fp32 accumulators (FlashAttention-2 register layout: the S accumulator
// becomes the P operand without a trip through shared memory); softmax is
// online, in base 2. The warps' states merge through shared memory into
// either the normalized output row or one fp32 partial state.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/launch.h"

namespace chunkattn::cuda {
namespace {

constexpr int kThreads = kWarps * 32;
constexpr float kLn2 = 0.693147180559945309f;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void Ldmatrix4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void Ldmatrix4Trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

template <typename T>
struct Ops;

template <>
struct Ops<__half> {
  // c += a (16x16, row) * b (16x8, col)
  __device__ __forceinline__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ __forceinline__ static __half From(float x) { return __float2half_rn(x); }
};

template <>
struct Ops<__nv_bfloat16> {
  __device__ __forceinline__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ __forceinline__ static __nv_bfloat16 From(float x) { return __float2bfloat16_rn(x); }
};

// Element offset of 16-byte piece `piece` of row `row` in a shared tile of
// D-element rows: pieces are XOR-swizzled by the row's low 3 bits, so the 8
// rows one ldmatrix phase reads sit in 8 different bank groups.
template <int D>
__device__ __forceinline__ int Swz(int row, int piece) {
  return row * D + ((piece ^ (row & 7)) << 3);
}

template <int D>
constexpr int AttendSmemBytes() {
  // Q tile + two stages of K and V; the epilogue reuses the stages.
  return (kTileRows * D + 2 * 2 * kStageTokens * D) * 2;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) AttendKernel(const AttendParams p) {
  static_assert(D % 32 == 0 && D <= 128, "head dim");
  static_assert(kWarps * kWarpRows * (D + 8) * 4 + 2 * kWarps * kWarpRows * 4 <= 2 * 2 * kStageTokens * D * 2,
                "the epilogue must fit in the stage buffers");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ bool key_mask[2][kStageTokens];  // which positions of a stage hold a key
  T* const sq = reinterpret_cast<T*>(smem_raw);
  T* const skv = sq + kTileRows * D;  // [stage][K, V][kStageTokens][D]
  constexpr int kPieces = D / 8;      // 16-byte pieces per row
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
  const T* const kpool = static_cast<const T*>(p.k);
  const T* const vpool = static_cast<const T*>(p.v);
  const int64_t chunk_stride = int64_t{p.num_kv_heads} * p.chunk_size * D;
  const int num_items = *p.num_items;

  for (int it = blockIdx.x; it < num_items; it += gridDim.x) {
    const WorkItem w = p.items[it];
    const int row_groups = RowGroups(w.num_rows);
    const int splits = kWarps / row_groups;
    const int rg = warp % row_groups, ks = warp / row_groups;
    const int sub = kStageTokens / splits;  // this warp's positions per stage: 16, 32 or 64
    const int32_t* const list_chunk = p.table_chunk + w.list;
    const int32_t* const list_tokens = p.table_tokens + w.list;
    const int32_t end = ItemEnd(w, p.chunk_size, p.group, list_tokens);
    const int num_stages = (end + kStageTokens - 1) / kStageTokens;
    const int64_t head_offset = int64_t{w.kv_head} * p.chunk_size * D;

    auto load_stage = [&](int stage, int buf) {
      T* const sk = skv + buf * 2 * kStageTokens * D;
      T* const sv = sk + kStageTokens * D;
      for (int i = tid; i < kStageTokens * kPieces; i += kThreads) {
        const int t = i / kPieces, piece = i % kPieces;
        const int32_t pos = stage * kStageTokens + t;
        const bool valid = pos < end && KeyAt(pos, p.log2_chunk, w.num_chunks, list_tokens);
        int64_t off = 0;
        if (valid) {
          off = list_chunk[pos >> p.log2_chunk] * chunk_stride + head_offset +
                int64_t{pos & (p.chunk_size - 1)} * D + piece * 8;
        }
        CpAsync16(sk + Swz<D>(t, piece), kpool + off, valid);
        CpAsync16(sv + Swz<D>(t, piece), vpool + off, valid);
        if (piece == 0) key_mask[buf][t] = valid;
      }
    };

    load_stage(0, 0);
    CpAsyncCommit();
    // The Q tile (rows past num_rows are zero and never written out).
    for (int i = tid; i < row_groups * kWarpRows * kPieces; i += kThreads) {
      const int r = i / kPieces, piece = i % kPieces;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (r < w.num_rows) {
        const RowRef ref = MapRow(w, r, p.group, p.num_heads, D);
        val = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.q) + ref.qo + piece * 8);
      }
      *reinterpret_cast<uint4*>(sq + Swz<D>(r, piece)) = val;
    }
    __syncthreads();
    uint32_t qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      Ldmatrix4(qa[kk], sq + Swz<D>(rg * kWarpRows + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * kk + (lane >> 4)));
    }
    // This thread's accumulator rows: row_a (c0, c1) and row_a + 8 (c2, c3).
    const int row_a = rg * kWarpRows + (lane >> 2);
    int32_t row_pos[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) row_pos[i] = w.pos0 < 0 ? INT32_MAX : w.pos0 + (row_a + 8 * i) / p.group;
    float acc[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
    float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.0f, 0.0f};

    for (int st = 0; st < num_stages; ++st) {
      if (st + 1 < num_stages) {
        load_stage(st + 1, (st + 1) & 1);
        CpAsyncCommit();
        CpAsyncWait<1>();
      } else {
        CpAsyncWait<0>();
      }
      __syncthreads();
      const T* const sk = skv + (st & 1) * 2 * kStageTokens * D;
      const T* const sv = sk + kStageTokens * D;
      const int tok0 = ks * sub;
      const int ntiles = sub / 8;
      if (st * kStageTokens + tok0 < end) {  // warp-uniform
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
          if (nt < ntiles) {
#pragma unroll
            for (int j = 0; j < D / 32; ++j) {
              uint32_t kb[4];
              Ldmatrix4(kb, sk + Swz<D>(tok0 + nt * 8 + (lane & 7), 4 * j + (lane >> 3)));
              Ops<T>::Mma(s[nt], qa[2 * j], kb[0], kb[1]);
              Ops<T>::Mma(s[nt], qa[2 * j + 1], kb[2], kb[3]);
            }
          }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          if (nt < ntiles) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int t = tok0 + nt * 8 + 2 * (lane & 3) + (e & 1);
              const bool ok = key_mask[st & 1][t] && st * kStageTokens + t <= row_pos[e >> 1];
              s[nt][e] = ok ? s[nt][e] * p.scale_log2 : -INFINITY;
              mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            }
          }
        }
        float m_use[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
          const float m_new = fmaxf(row_m[i], mx[i]);
          m_use[i] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet stays empty
          const float corr = exp2f(row_m[i] - m_use[i]);
          row_l[i] *= corr;
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
            acc[dt][2 * i] *= corr;
            acc[dt][2 * i + 1] *= corr;
          }
          row_m[i] = m_new;
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          if (nt < ntiles) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              s[nt][e] = exp2f(s[nt][e] - m_use[e >> 1]);
              row_l[e >> 1] += s[nt][e];
            }
          }
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if (kk < sub / 16) {
            const uint32_t pa[4] = {Ops<T>::Pack(s[2 * kk][0], s[2 * kk][1]), Ops<T>::Pack(s[2 * kk][2], s[2 * kk][3]),
                                    Ops<T>::Pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    Ops<T>::Pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int jn = 0; jn < D / 16; ++jn) {
              uint32_t vb[4];
              Ldmatrix4Trans(vb, sv + Swz<D>(tok0 + 16 * kk + ((lane >> 3) & 1) * 8 + (lane & 7), 2 * jn + (lane >> 4)));
              Ops<T>::Mma(acc[2 * jn], pa, vb[0], vb[1]);
              Ops<T>::Mma(acc[2 * jn + 1], pa, vb[2], vb[3]);
            }
          }
        }
      }
      __syncthreads();  // the stage buffer is refilled next iteration
    }

    // Epilogue: the warps' states through shared memory (the stage buffers,
    // free now), merged over the warps that split the positions. Rows are
    // padded by 8 floats so the quad-strided stores spread over all banks.
    CpAsyncWait<0>();  // nothing may still land in the buffers (an item with no stage)
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      row_l[i] += __shfl_xor_sync(0xffffffffu, row_l[i], 1);
      row_l[i] += __shfl_xor_sync(0xffffffffu, row_l[i], 2);
    }
    constexpr int kEpStride = D + 8;
    float* const ep_o = reinterpret_cast<float*>(skv);          // [warp][16][kEpStride]
    float* const ep_m = ep_o + kWarps * kWarpRows * kEpStride;  // [warp][16]
    float* const ep_l = ep_m + kWarps * kWarpRows;
    const int r_lo = lane >> 2;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        *reinterpret_cast<float2*>(&ep_o[(warp * kWarpRows + r_lo + 8 * i) * kEpStride + dt * 8 + 2 * (lane & 3)]) =
            make_float2(acc[dt][2 * i], acc[dt][2 * i + 1]);
      }
    }
    if ((lane & 3) == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        ep_m[warp * kWarpRows + r_lo + 8 * i] = row_m[i];
        ep_l[warp * kWarpRows + r_lo + 8 * i] = row_l[i];
      }
    }
    __syncthreads();
    for (int i = tid; i < row_groups * kWarpRows * D; i += kThreads) {
      const int r = i / D, x = i % D;
      if (r >= w.num_rows) continue;
      const int g16 = r / kWarpRows, rr = r % kWarpRows;
      float m = -INFINITY;
      for (int k = 0; k < splits; ++k) m = fmaxf(m, ep_m[(g16 + row_groups * k) * kWarpRows + rr]);
      float l = 0.0f, o = 0.0f;
      if (m != -INFINITY) {
        for (int k = 0; k < splits; ++k) {
          const int wr = (g16 + row_groups * k) * kWarpRows + rr;
          const float f = exp2f(ep_m[wr] - m);
          l += f * ep_l[wr];
          o += f * ep_o[wr * kEpStride + x];
        }
      }
      const RowRef ref = MapRow(w, r, p.group, p.num_heads, D);
      if (ref.partial < 0) {
        static_cast<T*>(p.o)[ref.qo + x] = Ops<T>::From(l > 0.0f ? o / l : 0.0f);
      } else {
        p.part_o[ref.partial * D + x] = o;
        if (x == 0) {
          p.part_m[ref.partial] = m * kLn2;
          p.part_n[ref.partial] = l;
        }
      }
    }
    __syncthreads();  // shared memory is reused by the next item
  }
}

// One warp per (merged sequence, head).
template <typename T>
__global__ void __launch_bounds__(kThreads) MergeKernel(const MergeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  constexpr int kMaxPerLane = 4;  // head dim <= 128
  const int H = p.num_heads, D = p.head_dim;
  const int total = *p.num_merge * H;
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (kThreads / 32);
  for (int wi = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5); wi < total; wi += warps) {
    const int i = wi / H, h = wi % H;
    float m = -INFINITY, n = 0.0f, o[kMaxPerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = p.merge_begin[i]; k < p.merge_begin[i + 1]; ++k) {
      const int64_t idx = int64_t{p.merge_slot[k]} * H + h;
      const float mb = p.part_m[idx], nb = p.part_n[idx];
      if (nb == 0.0f) continue;  // empty state
      const float m_new = fmaxf(m, mb);
      const float a = n == 0.0f ? 0.0f : __expf(m - m_new);
      const float b = __expf(mb - m_new);
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j) {
        if (lane + 32 * j < D) o[j] = a * o[j] + b * p.part_o[idx * D + lane + 32 * j];
      }
      n = a * n + b * nb;
      m = m_new;
    }
    T* const out = static_cast<T*>(p.o) + (int64_t{p.merge_seq[i]} * H + h) * D;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      if (lane + 32 * j < D) out[lane + 32 * j] = Ops<T>::From(n > 0.0f ? o[j] / n : 0.0f);
    }
  }
}

__global__ void __launch_bounds__(256) AppendKernel(const AppendParams p) {
  const int pieces = p.row_bytes / 16;
  const int64_t total = int64_t{p.num_tokens} * p.num_kv_heads * pieces;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / (int64_t{p.num_kv_heads} * pieces);
    const int h = static_cast<int>(i / pieces % p.num_kv_heads);
    const int piece = static_cast<int>(i % pieces);
    const int64_t slot = p.slots[t];
    if (slot < 0) continue;
    const int64_t dst =
        ((slot / p.chunk_size * p.num_kv_heads + h) * p.chunk_size + slot % p.chunk_size) * p.row_bytes + piece * 16;
    const int64_t src = (t * p.num_kv_heads + h) * p.row_bytes + piece * 16;
    *reinterpret_cast<uint4*>(static_cast<char*>(p.pool_k) + dst) =
        *reinterpret_cast<const uint4*>(static_cast<const char*>(p.k) + src);
    *reinterpret_cast<uint4*>(static_cast<char*>(p.pool_v) + dst) =
        *reinterpret_cast<const uint4*>(static_cast<const char*>(p.v) + src);
  }
}

// Naive: one block per (sequence, head) writes the scaled scores of all keys.
template <typename T>
__global__ void __launch_bounds__(128) NaiveScoresKernel(const NaiveParams p) {
  __shared__ float q[128];
  const int s = blockIdx.x / p.num_heads, h = blockIdx.x % p.num_heads;
  const int kvh = h / (p.num_heads / p.num_kv_heads), D = p.head_dim;
  const T* const qs = static_cast<const T*>(p.q) + (int64_t{s} * p.num_heads + h) * D;
  if (threadIdx.x < D) q[threadIdx.x] = ToFloat(qs[threadIdx.x]);
  __syncthreads();
  const T* const k = static_cast<const T*>(p.k) + (int64_t{s} * p.num_kv_heads + kvh) * p.max_len * D;
  float* const scores = p.scores + (int64_t{s} * p.num_heads + h) * p.max_len;
  for (int t = threadIdx.x; t < p.len[s]; t += blockDim.x) {
    float dot = 0.0f;
    for (int x = 0; x < D; ++x) dot += q[x] * ToFloat(k[int64_t{t} * D + x]);
    scores[t] = dot * p.scale;
  }
}

// Naive: softmax over the stored row, then P.V with a thread per dimension.
template <typename T>
__global__ void __launch_bounds__(128) NaiveSoftmaxPvKernel(const NaiveParams p) {
  __shared__ float red[128];
  const int s = blockIdx.x / p.num_heads, h = blockIdx.x % p.num_heads;
  const int kvh = h / (p.num_heads / p.num_kv_heads), D = p.head_dim, len = p.len[s];
  float* const scores = p.scores + (int64_t{s} * p.num_heads + h) * p.max_len;
  float m = -INFINITY;
  for (int t = threadIdx.x; t < len; t += blockDim.x) m = fmaxf(m, scores[t]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int w = 64; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0.0f;
  for (int t = threadIdx.x; t < len; t += blockDim.x) {
    const float e = __expf(scores[t] - m);
    scores[t] = e;
    sum += e;
  }
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int w = 64; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  sum = red[0];
  const T* const v = static_cast<const T*>(p.v) + (int64_t{s} * p.num_kv_heads + kvh) * p.max_len * D;
  if (threadIdx.x < D) {
    float acc = 0.0f;
    for (int t = 0; t < len; ++t) acc += scores[t] * ToFloat(v[int64_t{t} * D + threadIdx.x]);
    static_cast<T*>(p.o)[(int64_t{s} * p.num_heads + h) * D + threadIdx.x] = Ops<T>::From(acc / sum);
  }
}

// Calls f(T*, std::integral_constant<int, D>) for the (dtype, head dim)
// instantiation; cudaErrorInvalidValue for the others.
template <typename F>
cudaError_t Dispatch(DType dtype, int head_dim, F&& f) {
  if (dtype == DType::kFloat16 && head_dim == 64) return f(static_cast<__half*>(nullptr), std::integral_constant<int, 64>());
  if (dtype == DType::kFloat16 && head_dim == 128) return f(static_cast<__half*>(nullptr), std::integral_constant<int, 128>());
  if (dtype == DType::kBFloat16 && head_dim == 64) {
    return f(static_cast<__nv_bfloat16*>(nullptr), std::integral_constant<int, 64>());
  }
  if (dtype == DType::kBFloat16 && head_dim == 128) {
    return f(static_cast<__nv_bfloat16*>(nullptr), std::integral_constant<int, 128>());
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool HasAttendKernel(DType dtype, int head_dim) {
  return (dtype == DType::kFloat16 || dtype == DType::kBFloat16) && (head_dim == 64 || head_dim == 128);
}

cudaError_t PrepareAttendKernel(DType dtype, int head_dim, int* blocks_per_sm) {
  return Dispatch(dtype, head_dim, [&](auto* t, auto d) {
    using T = std::remove_pointer_t<decltype(t)>;
    constexpr int D = decltype(d)::value;
    const cudaError_t e =
        cudaFuncSetAttribute(AttendKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, AttendSmemBytes<D>());
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, AttendKernel<T, D>, kThreads,
                                                         AttendSmemBytes<D>());
  });
}

cudaError_t LaunchAttend(const AttendParams& p, DType dtype, int head_dim, int grid, cudaStream_t stream) {
  return Dispatch(dtype, head_dim, [&](auto* t, auto d) {
    using T = std::remove_pointer_t<decltype(t)>;
    constexpr int D = decltype(d)::value;
    AttendKernel<T, D><<<grid, kThreads, AttendSmemBytes<D>(), stream>>>(p);
    return cudaGetLastError();
  });
}

cudaError_t MergeKernelBinaryVersion(int* version) {
  cudaFuncAttributes a{};
  const cudaError_t e = cudaFuncGetAttributes(&a, MergeKernel<__half>);
  *version = a.binaryVersion;
  return e;
}

cudaError_t LaunchMerge(const MergeParams& p, DType dtype, int grid, bool programmatic, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  if (dtype == DType::kFloat16) return cudaLaunchKernelEx(&cfg, MergeKernel<__half>, p);
  if (dtype == DType::kBFloat16) return cudaLaunchKernelEx(&cfg, MergeKernel<__nv_bfloat16>, p);
  return cudaErrorInvalidValue;
}

cudaError_t LaunchAppendKv(const AppendParams& p, cudaStream_t stream) {
  const int64_t total = int64_t{p.num_tokens} * p.num_kv_heads * (p.row_bytes / 16);
  if (total == 0) return cudaSuccess;
  const int grid = static_cast<int>((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
  AppendKernel<<<grid, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchNaiveDecode(const NaiveParams& p, DType dtype, cudaStream_t stream) {
  if (p.head_dim > 128 || p.num_seqs < 1) return cudaErrorInvalidValue;
  const int grid = p.num_seqs * p.num_heads;
  if (dtype == DType::kFloat16) {
    NaiveScoresKernel<__half><<<grid, 128, 0, stream>>>(p);
    NaiveSoftmaxPvKernel<__half><<<grid, 128, 0, stream>>>(p);
  } else if (dtype == DType::kBFloat16) {
    NaiveScoresKernel<__nv_bfloat16><<<grid, 128, 0, stream>>>(p);
    NaiveSoftmaxPvKernel<__nv_bfloat16><<<grid, 128, 0, stream>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace chunkattn::cuda
