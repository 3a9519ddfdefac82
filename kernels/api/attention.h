// Host-only API shared by the CPU and CUDA attention kernels: views of the KV
// pool and the shapes of a decode or prefill step. No allocation, no
// ownership: every pointer is borrowed for the duration of one call.
#ifndef CHUNKATTN_KERNELS_API_ATTENTION_H_
#define CHUNKATTN_KERNELS_API_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/api/dtype.h"

namespace chunkattn {

// One layer of a worker's KV pool.
//   k, v: (num_chunks, num_kv_heads, chunk_size, head_dim) of `dtype`
// A chunk id indexes the first axis; slot `chunk * chunk_size + p` is token
// position p inside that chunk (the flat slots of PrefixForest::Slots).
struct KvPoolView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kFloat16;
  int64_t num_chunks = 0;
  int num_kv_heads = 0;
  int chunk_size = 0;
  int head_dim = 0;

  int64_t ChunkStride() const { return int64_t{num_kv_heads} * chunk_size * head_dim; }
};

// Heads of one attention layer (of this worker's shard). Query head h reads KV
// head h / (num_heads / num_kv_heads) (grouped-query attention).
struct AttentionShape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0;  // softmax scale; 0 means 1 / sqrt(head_dim)

  int group_size() const { return num_heads / num_kv_heads; }
  float EffectiveScale() const;
};

// Head dims the kernels accept: multiples of 16 up to 256 (64 and 128 are the
// tuned ones).
inline constexpr int kMaxHeadDim = 256;

// INVALID_ARGUMENT unless the view is non-null, its geometry valid and it
// matches `shape`.
absl::Status ValidateAttentionArgs(const KvPoolView& kv, const AttentionShape& shape);

// A batch of prefill (or chunked-prefill) work. Sequence s has
// `prefix_len[s]` tokens whose KV is already in the pool (a matched prefix or
// an earlier piece) and `q_begin[s+1] - q_begin[s]` new tokens at positions
// prefix_len[s], prefix_len[s]+1, ...; their KV must have been appended
// before attention runs. New token p attends to positions [0, p].
struct PrefillBatch {
  std::vector<int32_t> prefix_len;    // (num_seqs)
  std::vector<int32_t> q_begin;       // (num_seqs + 1) row offsets into q/o
  std::vector<int32_t> chunk_begin;   // (num_seqs + 1) offsets into chunk_ids
  std::vector<int32_t> chunk_ids;     // each sequence's chunks in position order

  int num_seqs() const { return static_cast<int>(prefix_len.size()); }
  int num_tokens() const { return q_begin.empty() ? 0 : q_begin.back(); }
};

// INVALID_ARGUMENT unless the arrays are consistent and every sequence has the
// chunks (ids below `num_pool_chunks`) to hold prefix_len + new tokens.
absl::Status ValidatePrefillBatch(const PrefillBatch& batch, int chunk_size,
                                  int64_t num_pool_chunks);

// INVALID_ARGUMENT unless every flat slot (chunk * chunk_size + position) is
// inside the pool `kv` (for KV appends).
absl::Status ValidateSlots(const KvPoolView& kv, absl::Span<const int64_t> slots);

}  // namespace chunkattn

#endif  // CHUNKATTN_KERNELS_API_ATTENTION_H_
