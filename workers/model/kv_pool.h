// A worker's KV chunk pool: for every layer, K and V of this rank's KV heads
// in chunks of `chunk_size` tokens, the layout of kernels/api KvPoolView.
// Chunk ids are the coordinator's (PrefixForest node ids), so every rank of a
// tensor-parallel group has the same number of chunks.
//
// Thread-compatible; owned by the worker's one thread.
#ifndef CHUNKATTN_WORKERS_MODEL_KV_POOL_H_
#define CHUNKATTN_WORKERS_MODEL_KV_POOL_H_

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"
#include "kernels/api/kv_layout.h"

namespace chunkattn {

class KvPool {
 public:
  // RESOURCE_EXHAUSTED when the memory cannot be had; INVALID_ARGUMENT for a
  // bad shape.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(const KvGeometry& shape,
                                                        int64_t num_chunks);

  const KvGeometry& shape() const { return shape_; }
  int64_t num_chunks() const { return num_chunks_; }
  KvPoolView Layer(int layer) const;

  // Copy-on-write copies for every layer, K and V, in order. Validates the
  // chunk ids and token counts first (nothing is copied on error).
  absl::Status Copy(absl::Span<const KvCopy> copies);

  // One chunk's KV as bytes (the KV tiers' unit, shape().BytesPerChunk()):
  // per layer, its K then its V slice of the chunk, each (num_kv_heads,
  // chunk_size, head_dim) of shape().dtype. INVALID_ARGUMENT for a chunk
  // outside the pool or a buffer of another size (nothing is copied).
  absl::Status ReadChunk(int64_t chunk, absl::Span<uint8_t> out) const;
  absl::Status WriteChunk(int64_t chunk, absl::Span<const uint8_t> in);

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  KvPool(const KvGeometry& shape, int64_t num_chunks) : shape_(shape), num_chunks_(num_chunks) {}
  absl::Status CheckChunkBuffer(int64_t chunk, size_t bytes) const;

  KvGeometry shape_;
  int64_t num_chunks_;
  int64_t layer_bytes_ = 0;  // one of K or V of one layer
  std::unique_ptr<uint8_t, Free> data_;  // layer l: K at 2l, V at 2l + 1
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_KV_POOL_H_
