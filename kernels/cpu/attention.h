// CPU attention over the chunked KV pool: two-phase partition (TPP) decode,
// its sequence-only baseline, prefill over chunked KV, KV append and copy.
// These are also the oracle the CUDA kernels are tested against.
//
// Decode follows section 3.2 of the ChunkAttention paper:
//  * chunk-first: for each run of consecutive shared chunks with the same
//    sequence range [i, j) (one entry chain of the context table) and each KV
//    head, the queries of sequences i..j-1 (times the GQA group) form one
//    matrix; K/V of each chunk are read once for all of them. The run is
//    reduced before it is written: one partial state per (sequence, head) per
//    run, not per chunk.
//  * sequence-first: for each (sequence, KV head), merge its partials, then
//    continue over its private chunks with one query vector at a time.
// DecodeImpl::kSequence is the paper's PagedAttention*: every sequence reads
// all its chunks itself (shared ones included, same physical memory).
//
// Thread-compatibility: a CpuAttention is used by one thread at a time (it
// owns the scratch); it parallelizes internally over its ThreadPool.
#ifndef CHUNKATTN_KERNELS_CPU_ATTENTION_H_
#define CHUNKATTN_KERNELS_CPU_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"
#include "kernels/api/decode_plan.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/int8_layout.h"
#include "base/thread_pool.h"

namespace chunkattn::cpu {

// Instruction sets with a kernel build. kAvx2 needs AVX2, FMA and F16C;
// kAvx512 needs those and AVX-512 F, BW, VL and VNNI, and differs from kAvx2
// only in the decode Linear kernels, whose results it gives bit for bit.
enum class Isa { kPortable, kAvx2, kAvx512 };
const char* IsaName(Isa isa);
bool IsaSupported(Isa isa);
Isa BestIsa();
// "best" (BestIsa) or an IsaName; INVALID_ARGUMENT for another name,
// FAILED_PRECONDITION for an ISA this CPU lacks.
absl::StatusOr<Isa> ParseIsa(absl::string_view name);
// Whether this CPU converts halves in hardware (F16C), read from CPUID: GCC's
// and Clang's __builtin_cpu_supports do not agree on the "f16c" name.
bool CpuHasF16c();

class CpuAttention {
 public:
  // `pool` (borrowed, may be null for single-threaded) must outlive this.
  explicit CpuAttention(ThreadPool* pool, Isa isa = BestIsa());

  Isa isa() const { return isa_; }

  // Decode attention for one layer.
  //   q: (num_seqs, num_heads, head_dim) fp32, sequences in context order
  //   o: (num_seqs, num_heads, head_dim) fp32
  // `plan` must come from PlanDecode on a context with the same version and
  // structure (FAILED_PRECONDITION otherwise); token counts are read from ctx.
  absl::Status Decode(DecodeImpl impl, const DecodePlan& plan, const ChunkContext& ctx,
                      const KvPoolView& kv, const AttentionShape& shape, const float* q, float* o);

  // Prefill attention for one layer (causal over new tokens, full over the
  // prefix already in the pool). The new tokens' KV must already be appended.
  //   q, o: (batch.num_tokens(), num_heads, head_dim) fp32
  absl::Status Prefill(const PrefillBatch& batch, const KvPoolView& kv, const AttentionShape& shape,
                       const float* q, float* o);

 private:
  // Grows every thread's scratch to at least `floats`.
  void ReserveScratch(int64_t floats);

  ThreadPool* pool_;
  Isa isa_;
  std::vector<std::vector<float>> scratch_;  // per pool thread
  std::vector<float> part_o_, part_m_, part_n_;
};

// Writes K/V of new tokens into their slots (chunk * chunk_size + position).
//   k, v: (num_tokens, num_kv_heads, head_dim) fp32, rounded to kv.dtype
absl::Status AppendKv(const KvPoolView& kv, const float* k, const float* v,
                      absl::Span<const int64_t> slots);

// Applies copy-on-write copies in order (see KvCopy).
absl::Status CopyKv(const KvPoolView& kv, absl::Span<const KvCopy> copies);

// The naive baseline (the paper's "Naive"): every sequence has its own dense
// copy of its KV, and attention materializes the full score row.
struct DenseKv {
  DType dtype = DType::kFloat16;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t max_len = 0;
  std::vector<int32_t> len;    // (num_seqs)
  std::vector<uint8_t> k, v;   // (num_seqs, num_kv_heads, max_len, head_dim) of dtype
};

// Copies each context sequence's KV out of the pool.
absl::StatusOr<DenseKv> GatherDense(const ChunkContext& ctx, const KvPoolView& kv);

absl::Status NaiveDecode(const DenseKv& kv, const AttentionShape& shape, const float* q, float* o,
                         ThreadPool* pool, Isa isa = BestIsa());

// The model's Linear layers for few rows (decode), beside the attention that
// shares their ISA dispatch and threads:
//   c (rows, n) = a (rows, k) * w^T,  w (n, k) row-major in `w_dtype`
// Each weight row is read once for all rows (BLAS's sgemm packs the whole
// weight matrix first, 12x the time of one pass for a single row), and the
// columns are split across `pool`'s threads (null: this thread). k must be a
// multiple of 8. Each c(r, j) is summed in one fixed order, so a row's result
// does not depend on the other rows.
absl::Status LinearRows(const float* a, int64_t rows, int64_t k, const void* w, DType w_dtype, int64_t n,
                        float* c, ThreadPool* pool, Isa isa = BestIsa());

// A Linear layer's weight matrix (n, k), row-major, as the kernels read it:
// fp32, fp16 or bf16 values (`scales` null), or weight-only int8 with one
// fp16 scale per `block` columns of a row (`scales` set, `dtype` ignored):
//   w(j, i) = q(j, i) * scales[j * (k / block) + i / block]
// computed as that fp32 product (the scale widened exactly) wherever it is
// read, so the decode kernel and the prefill path's dequantized rows see the
// same values.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  const uint16_t* scales = nullptr;  // (n, k / block) IEEE half bits: int8 weights
  int64_t block = 0;              // int8: columns per scale, divides k
  // int8: q in the decode kernel's interleaved layout (int8_layout.h:
  // Int8Interleaves(n, k, block) must hold, and index Int8InterleavedIndex);
  // scales stay in column order.
  bool interleaved = false;
  // fp32, fp16 or bf16: rows in the decode kernel's packed layout
  // (packed_layout.h; Packs(n, k) must hold).
  bool packed = false;
};


// LinearRows on any WeightView; int8 needs a block that is a multiple of 8.
absl::Status LinearRows(const float* a, int64_t rows, int64_t k, const WeightView& w, int64_t n, float* c,
                        ThreadPool* pool, Isa isa = BestIsa());

// out (j1 - j0, k) = rows [j0, j1) of `w` (n, k) as fp32, for any k (the
// prefill path converts a block of weight rows and hands it to sgemm).
// Rows are split over `pool` when there are many.
absl::Status WeightRowsToFloat(const WeightView& w, int64_t k, int64_t j0, int64_t j1, float* out, ThreadPool* pool,
                               Isa isa = BestIsa());

}  // namespace chunkattn::cpu

#endif  // CHUNKATTN_KERNELS_CPU_ATTENTION_H_
