// Geometry of the paged KV pool, shared by the cache coordinator (to size the
// chunk pool) and the kernels (to index it). Header-only and constexpr so the
// same arithmetic runs on host and device and is unit-tested without a GPU.
#ifndef CHUNKATTN_KERNELS_API_KV_LAYOUT_H_
#define CHUNKATTN_KERNELS_API_KV_LAYOUT_H_

#include <cstdint>

#include "base/host_device.h"
#include "kernels/api/dtype.h"

namespace chunkattn {

// Chunk sizes the cache and kernels accept: powers of two in [16, 256] tokens.
inline constexpr int kMinChunkSize = 16;
inline constexpr int kMaxChunkSize = 256;
inline constexpr int kDefaultChunkSize = 64;

CHUNKATTN_HOST_DEVICE constexpr bool IsValidChunkSize(int c) {
  return c >= kMinChunkSize && c <= kMaxChunkSize && (c & (c - 1)) == 0;
}

// log2(c) for a valid chunk size: positions split into (chunk, slot) by shifts.
CHUNKATTN_HOST_DEVICE constexpr int Log2ChunkSize(int c) {
  int l = 0;
  while ((1 << l) < c) ++l;
  return l;
}

// Shape of one worker's KV pool, for the coordinator (sizing its chunk pool)
// and the workers (allocating theirs). Per layer, K and V are each laid out as
// (num_chunks, num_kv_heads, chunk_size, head_dim); a chunk id indexes the
// first axis of every layer's K and V.
struct KvGeometry {
  int num_layers = 0;
  int num_kv_heads = 0;  // heads held by this pool (a tensor-parallel shard holds a slice)
  int chunk_size = kDefaultChunkSize;  // tokens per chunk
  int head_dim = 0;
  DType dtype = DType::kFloat16;  // storage of K and V

  // Elements of K (or V) for one chunk in one layer.
  CHUNKATTN_HOST_DEVICE constexpr int64_t ChunkElementsPerLayer() const {
    return int64_t{num_kv_heads} * chunk_size * head_dim;
  }
  // Bytes one chunk occupies across all layers, K and V.
  CHUNKATTN_HOST_DEVICE constexpr int64_t BytesPerChunk() const {
    return int64_t{num_layers} * 2 * ChunkElementsPerLayer() * DTypeBytes(dtype);
  }
  // Bytes of KV for one token across all layers (BytesPerChunk / chunk_size).
  CHUNKATTN_HOST_DEVICE constexpr int64_t BytesPerToken() const {
    return int64_t{num_layers} * 2 * num_kv_heads * head_dim * DTypeBytes(dtype);
  }
  // Element offset of (chunk, head, slot, dim) inside one layer's K or V.
  CHUNKATTN_HOST_DEVICE constexpr int64_t Offset(int64_t chunk, int head, int slot,
                                                 int dim) const {
    return ((chunk * num_kv_heads + head) * chunk_size + slot) * head_dim + dim;
  }
  // Bounds keep every product above far inside int64 (at most 2^43 bytes/chunk).
  CHUNKATTN_HOST_DEVICE constexpr bool IsValid() const {
    return num_layers > 0 && num_layers <= 1024 && num_kv_heads > 0 && num_kv_heads <= 1024 &&
           head_dim > 0 && head_dim <= 1024 && IsValidChunkSize(chunk_size) &&
           (dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16);
  }
};

// Number of whole chunks that fit in `budget_bytes`; 0 for an invalid geometry.
CHUNKATTN_HOST_DEVICE constexpr int64_t ChunksForBudget(const KvGeometry& g,
                                                       int64_t budget_bytes) {
  return g.IsValid() && budget_bytes > 0 ? budget_bytes / g.BytesPerChunk() : 0;
}

}  // namespace chunkattn

#endif  // CHUNKATTN_KERNELS_API_KV_LAYOUT_H_
