// CUDA attention over the chunked KV pool, with the API of CpuAttention:
// two-phase partition decode (and its sequence-only baseline), prefill over
// chunked KV, KV append and copy. All pointers in KvPoolView, q, o, k and v
// are device pointers of the device this object was created on; K/V, q and
// o are fp16 or bf16 (the pool's dtype), head dims 64 and 128.
//
// Decode is two steps so it can live in a CUDA graph:
//  * PrepareDecode (host work, not capturable): re-plans when the context
//    version, impl or shape changed and uploads the plan, then uploads this
//    step's filled-slot counts (the only thing that changes within a version);
//  * LaunchDecode (capturable): the attention kernel and the merge kernel
//    (a programmatic dependent launch on sm_90+ builds), which read their sizes from
//    device memory, so one captured graph serves every later plan as long as
//    buffer_generation() is unchanged. The decode buffers only grow, and
//    never once ReserveDecode sized them for the contexts to come.
// Decode() does both.
//
// Uploads go through a pinned staging buffer; a call waits for the previous
// upload's copy to finish before it reuses the buffer, never for kernels.
// Use one stream per object: uploads and kernels are ordered by it.
//
// Thread-compatibility: one thread at a time (it owns the plan and buffers).
#ifndef CHUNKATTN_KERNELS_CUDA_CUDA_ATTENTION_H_
#define CHUNKATTN_KERNELS_CUDA_CUDA_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/plan.h"

namespace chunkattn::cuda {

// A device allocation, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class CudaAttention {
 public:
  struct Options {
    int device = 0;
    // Split-KV tuning; concurrent_items 0 = SMs x resident blocks (measured).
    PlanOptions plan;
  };

  static absl::StatusOr<std::unique_ptr<CudaAttention>> Create(const Options& options);
  ~CudaAttention();
  CudaAttention(const CudaAttention&) = delete;
  CudaAttention& operator=(const CudaAttention&) = delete;

  int device() const { return options_.device; }

  // Decode attention for one layer: q, o (num_seqs, num_heads, head_dim).
  absl::Status Decode(DecodeImpl impl, const ChunkContext& ctx, const KvPoolView& kv, const AttentionShape& shape,
                      const void* q, void* o, cudaStream_t stream);
  absl::Status PrepareDecode(DecodeImpl impl, const ChunkContext& ctx, const KvPoolView& kv,
                             const AttentionShape& shape, cudaStream_t stream);
  // FAILED_PRECONDITION unless PrepareDecode ran with this shape and pool.
  absl::Status LaunchDecode(const KvPoolView& kv, const AttentionShape& shape, const void* q, void* o,
                            cudaStream_t stream);

  // Sizes the decode buffers for every context of at most `max_seqs`
  // sequences of at most `max_seq_chunks` chunks (BoundDecodeWork), so that
  // no later PrepareDecode within those limits reallocates them.
  absl::Status ReserveDecode(DecodeImpl impl, int max_seqs, int max_seq_chunks, DType dtype,
                             const AttentionShape& shape);

  // The current decode plan (for tests and the benchmark's report).
  const DecodeWork* decode_work() const { return decode_ ? &*decode_ : nullptr; }
  // Bumped whenever a buffer LaunchDecode reads is reallocated (prefill and
  // append buffers are not captured in graphs and do not count).
  uint64_t buffer_generation() const { return generation_; }

  // Prefill attention for one layer (causal over the new tokens, full over
  // the prefix in the pool); the new tokens' KV must be appended first.
  //   q, o: (batch.num_tokens(), num_heads, head_dim)
  absl::Status Prefill(const PrefillBatch& batch, const KvPoolView& kv, const AttentionShape& shape, const void* q,
                       void* o, cudaStream_t stream);
  // Prefill as two steps, so a model plans and uploads once per step and
  // launches once per layer (the layers share the batch, shape and pool
  // geometry; kv may be any layer's view).
  absl::Status PreparePrefill(const PrefillBatch& batch, const KvPoolView& kv, const AttentionShape& shape,
                              cudaStream_t stream);
  // FAILED_PRECONDITION unless PreparePrefill succeeded with this shape and pool.
  absl::Status LaunchPrefill(const KvPoolView& kv, const AttentionShape& shape, const void* q, void* o,
                             cudaStream_t stream);

  // Writes K/V of new tokens (num_tokens, num_kv_heads, head_dim) of kv.dtype
  // into their slots (chunk * chunk_size + position).
  absl::Status AppendKv(const KvPoolView& kv, const void* k, const void* v, absl::Span<const int64_t> slots,
                        cudaStream_t stream);

  // Applies copy-on-write copies in order (see KvCopy).
  absl::Status CopyKv(const KvPoolView& kv, absl::Span<const KvCopy> copies, cudaStream_t stream);

 private:
  explicit CudaAttention(const Options& options) : options_(options) {}

  // A device region that only grows (geometrically).
  static absl::Status Reserve(DeviceBuffer* buf, size_t bytes);
  // Grows the decode buffers to hold arrays of these sizes; bumps
  // generation_ when any is reallocated.
  absl::Status ReserveDecodeBuffers(const DecodeWorkBounds& bounds, int num_heads, int head_dim);
  // Copies `pieces` (host bytes -> device buffer) through the staging buffer.
  struct Piece {
    const void* src;
    size_t bytes;
    void* dst;
  };
  absl::Status Upload(absl::Span<const Piece> pieces, cudaStream_t stream);
  absl::Status CheckPool(const KvPoolView& kv, const AttentionShape& shape) const;
  absl::StatusOr<int> ConcurrentItems(DType dtype, int head_dim);

  Options options_;
  int num_sms_ = 0;
  bool programmatic_merge_ = false;  // the merge kernel's binary is sm_90+ (see LaunchMerge)
  int concurrent_[2][2] = {};  // [bf16][d == 128]: resident blocks, once measured
  uint64_t generation_ = 0;

  // Pinned staging for uploads, and the event after its last copy.
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  cudaEvent_t staged_ = nullptr;

  // Decode: the plan, its key and its device copy.
  std::optional<DecodeWork> decode_;
  struct DecodeKey {
    DecodeImpl impl;
    int num_heads, num_kv_heads, head_dim;
    DType dtype;
    int64_t num_chunks;
    int concurrent;

    bool operator==(const DecodeKey& o) const {
      return impl == o.impl && num_heads == o.num_heads && num_kv_heads == o.num_kv_heads &&
             head_dim == o.head_dim && dtype == o.dtype && num_chunks == o.num_chunks && concurrent == o.concurrent;
    }
  };
  DecodeKey decode_key_{};
  std::vector<int32_t> tokens_;
  int decode_grid_ = 0;
  DeviceBuffer d_counts_;  // [num_items, num_merge] of decode, then of prefill
  DeviceBuffer d_items_, d_table_chunk_, d_table_tokens_, d_merge_seq_, d_merge_begin_, d_merge_slot_;
  DeviceBuffer d_part_o_, d_part_m_, d_part_n_;
  // Prefill (not graph-captured): its own plan buffers and the geometry it
  // was planned for.
  bool prefill_ready_ = false;
  DecodeKey prefill_key_{};
  int prefill_chunk_size_ = 0;
  int prefill_grid_ = 0;
  DeviceBuffer d_pf_items_, d_pf_chunk_, d_pf_tokens_;
  // AppendKv slots.
  DeviceBuffer d_slots_;
};

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_CUDA_ATTENTION_H_
