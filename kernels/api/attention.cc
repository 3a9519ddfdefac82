#include "kernels/api/attention.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/api/kv_layout.h"

namespace chunkattn {

float AttentionShape::EffectiveScale() const {
  return scale != 0 ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

absl::Status ValidateAttentionArgs(const KvPoolView& kv, const AttentionShape& shape) {
  if (kv.k == nullptr || kv.v == nullptr) return absl::InvalidArgumentError("KV pool view has null K or V");
  KvGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = kv.num_kv_heads;
  g.chunk_size = kv.chunk_size;
  g.head_dim = kv.head_dim;
  g.dtype = kv.dtype;
  if (!g.IsValid() || kv.num_chunks <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "invalid KV pool view: %d chunks, %d kv heads, chunk size %d, head dim %d", kv.num_chunks,
        kv.num_kv_heads, kv.chunk_size, kv.head_dim));
  }
  if (kv.head_dim % 16 != 0 || kv.head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head dim %d unsupported: need a multiple of 16 up to %d", kv.head_dim, kMaxHeadDim));
  }
  if (shape.num_kv_heads != kv.num_kv_heads || shape.head_dim != kv.head_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shape (%d kv heads, head dim %d) does not match the KV pool (%d, %d)", shape.num_kv_heads,
        shape.head_dim, kv.num_kv_heads, kv.head_dim));
  }
  if (shape.num_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0 || shape.num_heads > 4096) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d query heads is not a multiple of %d kv heads", shape.num_heads, shape.num_kv_heads));
  }
  if (!std::isfinite(shape.scale) || shape.scale < 0) {
    return absl::InvalidArgumentError("softmax scale must be finite and >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidatePrefillBatch(const PrefillBatch& batch, int chunk_size, int64_t num_pool_chunks) {
  const int n = batch.num_seqs();
  if (batch.q_begin.size() != static_cast<size_t>(n) + 1 ||
      batch.chunk_begin.size() != static_cast<size_t>(n) + 1) {
    return absl::InvalidArgumentError("prefill batch: q_begin and chunk_begin need num_seqs + 1 entries");
  }
  if (batch.q_begin[0] != 0 || batch.chunk_begin[0] != 0 ||
      batch.chunk_begin[n] != static_cast<int32_t>(batch.chunk_ids.size())) {
    return absl::InvalidArgumentError("prefill batch: offsets must start at 0 and end at the array sizes");
  }
  for (int s = 0; s < n; ++s) {
    const int64_t new_tokens = int64_t{batch.q_begin[s + 1]} - batch.q_begin[s];
    const int64_t chunks = int64_t{batch.chunk_begin[s + 1]} - batch.chunk_begin[s];
    if (new_tokens < 1 || batch.prefix_len[s] < 0 || chunks < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prefill batch: sequence %d has %d new tokens and prefix %d", s, new_tokens, batch.prefix_len[s]));
    }
    const int64_t len = batch.prefix_len[s] + new_tokens;
    if (chunks * chunk_size < len) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prefill batch: sequence %d has %d tokens but only %d chunks", s, len, chunks));
    }
  }
  for (int32_t c : batch.chunk_ids) {
    if (c < 0 || c >= num_pool_chunks) {
      return absl::InvalidArgumentError(absl::StrFormat("prefill batch: chunk %d outside the pool", c));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSlots(const KvPoolView& kv, absl::Span<const int64_t> slots) {
  const int64_t num_slots = kv.num_chunks * kv.chunk_size;
  for (int64_t slot : slots) {
    if (slot < 0 || slot >= num_slots) {
      return absl::InvalidArgumentError(
          absl::StrFormat("KV slot %d outside the pool's %d slots", slot, num_slots));
    }
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
