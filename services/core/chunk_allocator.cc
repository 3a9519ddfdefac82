#include "services/core/chunk_allocator.h"

#include "absl/strings/str_format.h"

namespace chunkattn {

ChunkAllocator::ChunkAllocator(int32_t capacity) : allocated_(capacity, 0) {
  free_list_.reserve(capacity);
  for (int32_t id = capacity - 1; id >= 0; --id) free_list_.push_back(id);
}

absl::StatusOr<ChunkAllocator> ChunkAllocator::FromBudget(const KvGeometry& geometry,
                                                          int64_t budget_bytes) {
  if (!geometry.IsValid()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "invalid KV geometry: layers=%d kv_heads=%d chunk_size=%d head_dim=%d dtype=%s",
        geometry.num_layers, geometry.num_kv_heads, geometry.chunk_size, geometry.head_dim,
        DTypeName(geometry.dtype)));
  }
  const int64_t chunks = ChunksForBudget(geometry, budget_bytes);
  if (chunks < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV budget of %d bytes holds no chunk of %d bytes", budget_bytes, geometry.BytesPerChunk()));
  }
  if (chunks > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrFormat("KV budget gives %d chunks, over %d", chunks, kMaxChunks));
  }
  return ChunkAllocator(static_cast<int32_t>(chunks));
}

absl::StatusOr<ChunkId> ChunkAllocator::Allocate() {
  if (free_list_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("chunk pool exhausted: all %d chunks in use", capacity()));
  }
  const ChunkId id = free_list_.back();
  free_list_.pop_back();
  allocated_[id] = 1;
  return id;
}

absl::Status ChunkAllocator::Free(ChunkId id) {
  if (id < 0 || id >= capacity()) {
    return absl::FailedPreconditionError(absl::StrFormat("chunk %d outside pool of %d", id, capacity()));
  }
  if (!allocated_[id]) {
    return absl::FailedPreconditionError(absl::StrFormat("chunk %d freed twice", id));
  }
  allocated_[id] = 0;
  free_list_.push_back(id);
  return absl::OkStatus();
}

}  // namespace chunkattn
