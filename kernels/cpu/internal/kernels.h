// The per-ISA inner kernels behind kernels/cpu/attention.h. Plain structs of
// borrowed pointers, no allocation: the caller (attention.cc) owns the plan,
// the scratch and the threads, and picks a table by ISA and storage dtype.
#ifndef CHUNKATTN_KERNELS_CPU_INTERNAL_KERNELS_H_
#define CHUNKATTN_KERNELS_CPU_INTERNAL_KERNELS_H_

#include <cstdint>

#include "kernels/api/dtype.h"
#include "kernels/cpu/internal/storage.h"

namespace chunkattn::cpu::internal {

// One KV head of one layer of the pool; the element type is implied by the
// table the kernel came from.
struct KvHead {
  const void* k = nullptr;  // pool K base (chunk 0, head 0)
  const void* v = nullptr;
  int64_t chunk_stride = 0;  // elements between chunks: kv_heads * chunk_size * head_dim
  int64_t head_offset = 0;   // elements from a chunk's start to this head's (chunk_size, head_dim) block
  int chunk_size = 0;
  int head_dim = 0;
};

// A list of chunks in position order and the filled slots of each.
struct ChunkList {
  const int32_t* chunks = nullptr;
  const int32_t* tokens = nullptr;
  int count = 0;
};

// Attention of a block of query rows against a list of chunks, in the
// matrix-product form of the chunk-first phase (Eqn 1): the K/V of a chunk are
// loaded once for all rows. Rows are `row_groups` x `group`: row (a, r) is
// query head `r` of the group, for sequence (decode) or token (prefill) `a`.
struct BlockArgs {
  KvHead kv;
  ChunkList list;
  int row_groups = 0;
  int group = 0;
  float scale = 0;
  const float* q = nullptr;  // row (a, r) at q + a * q_stride + r * head_dim
  int64_t q_stride = 0;
  // Causal mask (prefill): row group a is the token at position q_pos0 + a;
  // chunk e of the list holds positions [e * chunk_size, ...).
  bool causal = false;
  int64_t q_pos0 = 0;
  // Output. normalize: o(a, r) = attention output. Otherwise the unnormalized
  // state (o, m, n) of attention_state.h, with m/n(a, r) at a * st_stride + r.
  bool normalize = false;
  float* o = nullptr;  // row (a, r) at o + a * o_stride + r * head_dim
  int64_t o_stride = 0;
  float* m = nullptr;
  float* n = nullptr;
  int64_t st_stride = 0;
  float* scratch = nullptr;  // BlockScratchFloats(...) floats
};

inline int64_t RoundUp8(int64_t x) { return (x + 7) / 8 * 8; }

inline int64_t BlockScratchFloats(int rows, int chunk_size, int head_dim) {
  const int64_t mp = RoundUp8(rows);
  return head_dim * mp + int64_t{chunk_size} * head_dim + chunk_size * mp + mp * head_dim + 3 * mp;
}

// Attention of the `group` query heads of one sequence against its chunks, one
// query vector at a time (the sequence-first phase, Algorithm 2), continuing
// from the state in `o/m/n` (the merged chunk-first partials, or empty).
struct SeqArgs {
  KvHead kv;
  const ChunkList* lists = nullptr;  // processed in order
  int num_lists = 0;
  int group = 0;
  float scale = 0;
  const float* q = nullptr;  // (group, head_dim)
  float* o = nullptr;        // (group, head_dim) state in, attention output out
  float* m = nullptr;        // (group)
  float* n = nullptr;        // (group)
  float* scratch = nullptr;  // SeqScratchFloats(...) floats
};

inline int64_t SeqScratchFloats(int group, int chunk_size, int head_dim) {
  return int64_t{group} * head_dim + int64_t{group} * (chunk_size + 8);
}

// The naive baseline, as three separate passes over the whole batch (what a
// framework's matmul, softmax, matmul does): scores of one query head group
// against a dense (len, head_dim) K into a materialized score tensor, softmax
// of each score row in place, then probabilities times a dense V.
struct NaiveArgs {
  const void* k = nullptr;  // (len, head_dim)
  const void* v = nullptr;
  int64_t len = 0;
  int head_dim = 0;
  int group = 0;
  float scale = 0;
  const float* q = nullptr;  // (group, head_dim)
  float* scores = nullptr;   // (group, score_stride): scores, then probabilities
  int64_t score_stride = 0;  // >= len rounded up to 8
  float* o = nullptr;        // (group, head_dim)
};

// Rows of activations times a weight matrix in the table's dtype, the
// matrix-vector form of a Linear layer for few rows (decode):
//   c(r, j) = sum_i a(r, i) * w(j, i)   for r < rows, j in [j0, j1)
// Each weight row is loaded once for all rows, so the weights stream from
// memory once per call. Every c(r, j) is summed in the same order whatever
// `rows` and [j0, j1) are: a row's result does not depend on its batch.
struct LinearArgs {
  const float* a = nullptr;  // row r at a + r * a_stride
  int64_t a_stride = 0;
  int rows = 0;
  const void* w = nullptr;  // (n, k) row-major: a PyTorch Linear's weight
  int64_t k = 0;            // a multiple of 8
  int64_t j0 = 0, j1 = 0;
  float* c = nullptr;  // row r at c + r * c_stride
  int64_t c_stride = 0;
  // Weight-only int8 (linear_q8): w holds int8 q with fp16 scales,
  //   w(j, i) = q(j, i) * scales[j * (k / block) + i / block],
  // block a multiple of 8 that divides k. Each weight vector is scaled once
  // (an fp32 product, what WeightRowsArgs' dequantization gives) and then
  // used for every row.
  const uint16_t* scales = nullptr;  // IEEE half bits
  int64_t block = 0;
  // Int8 weights with a block that is a multiple of 32 (the loader's): the
  // rows' activations as int16, one scale per 32 columns (quantize16), which
  // the kernel dots with the weights in integers:
  //   c(r, j) = sum over groups g of sa(r, g) * sw(j, g) * sum_i aq(r, i) q(j, i)
  // aq(r, i) = round(a(r, i) / sa(r, g)), sa = max |a| / 32767 over the group:
  // 15 bits against the weights' 7, an error hundreds of times under the
  // weights' own. Null: the weights are widened and scaled instead.
  const int16_t* aq = nullptr;  // row r at aq + r * k
  const float* aq_scales = nullptr;  // row r at aq_scales + r * (k / 32)
  // w in the interleaved layout (int8_layout.h) and aq in its column order
  // (Int8InterleavedColumn), k a multiple of 256 and block 32: each group's
  // dot is one lane of an integer vector, and a tile of 4 weight rows one
  // stream.
  bool interleaved = false;
  // fp32, fp16 or bf16 w in the packed layout (packed_layout.h): j0 and j1
  // multiples of 4.
  bool packed = false;
};

// Rows [j0, j1) of a weight matrix (n, k) in the table's dtype as fp32, for
// the prefill path's sgemm: out(j - j0, i) = w(j, i). Any k (a tail of under
// 8 is converted one value at a time); int8 (weight_rows_q8) reads `scales`
// and `block` as LinearArgs does, block any divisor of k.
struct WeightRowsArgs {
  const void* w = nullptr;
  const uint16_t* scales = nullptr;  // IEEE half bits
  int64_t block = 0;
  bool interleaved = false;  // int8 rows in the interleaved layout (int8_layout.h)
  bool packed = false;       // rows in the packed layout (packed_layout.h)
  int64_t k = 0;
  int64_t j0 = 0, j1 = 0;
  float* out = nullptr;  // (j1 - j0, k)
};

struct IsaKernels {
  void (*linear)(const LinearArgs&) = nullptr;
  void (*linear_q8)(const LinearArgs&) = nullptr;  // the same in every dtype's table
  void (*weight_rows)(const WeightRowsArgs&) = nullptr;
  void (*weight_rows_q8)(const WeightRowsArgs&) = nullptr;  // the same in every dtype's table
  // q (k) and scales (k / 32) of one activation row x (k), k a multiple of
  // 32, for LinearArgs::aq; the same in every dtype's table.
  void (*quantize16)(const float* x, int64_t k, int16_t* q, float* scales) = nullptr;
  // The same with q in Int8InterleavedColumn order (k a multiple of 256).
  void (*quantize16_interleaved)(const float* x, int64_t k, int16_t* q, float* scales) = nullptr;
  void (*block)(const BlockArgs&) = nullptr;
  void (*seq)(const SeqArgs&) = nullptr;
  void (*naive_scores)(const NaiveArgs&) = nullptr;
  void (*naive_softmax)(const NaiveArgs&) = nullptr;
  void (*naive_pv)(const NaiveArgs&) = nullptr;
};

// Tables for one storage dtype; Avx2Kernels and Avx512Kernels return nullptr
// when this build has no such path (non-x86 host).
const IsaKernels* PortableKernels(DType dtype);
const IsaKernels* Avx2Kernels(DType dtype);
const IsaKernels* Avx512Kernels(DType dtype);

// Defines FN, one of the functions above: the dtype -> table function whose
// tables TABLE<F32>(), TABLE<F16>() and TABLE<BF16>() build (storage.h tags).
#define CHUNKATTN_DEFINE_KERNEL_TABLES(FN, TABLE)                              \
  const IsaKernels* FN(DType dtype) {                                          \
    static const IsaKernels f32 = TABLE<F32>();                                \
    static const IsaKernels f16 = TABLE<F16>();                                \
    static const IsaKernels bf16 = TABLE<BF16>();                              \
    switch (dtype) {                                                           \
      case DType::kFloat32: return &f32;                                       \
      case DType::kFloat16: return &f16;                                       \
      case DType::kBFloat16: return &bf16;                                     \
    }                                                                          \
    return nullptr;                                                            \
  }

}  // namespace chunkattn::cpu::internal

#endif  // CHUNKATTN_KERNELS_CPU_INTERNAL_KERNELS_H_
