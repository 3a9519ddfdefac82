// A fixed pool of physical KV chunk ids [0, capacity). The pool never grows:
// its size comes from a byte budget (kernels/api/kv_layout.h) and every worker
// preallocates the same number of chunks, so a chunk id means the same slot
// on every tensor-parallel rank.
//
// Not thread-safe: owned by the cache coordinator's loop thread.
#ifndef CHUNKATTN_SERVICES_CORE_CHUNK_ALLOCATOR_H_
#define CHUNKATTN_SERVICES_CORE_CHUNK_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/api/kv_layout.h"

namespace chunkattn {

using ChunkId = int32_t;

// The most chunks a pool may have. Ids above it are free for other uses (the
// prefix forest numbers its namespace roots there).
inline constexpr int32_t kMaxChunks = int32_t{1} << 30;

class ChunkAllocator {
 public:
  // REQUIRES: 0 <= capacity <= kMaxChunks.
  explicit ChunkAllocator(int32_t capacity);

  // A pool sized from a KV memory budget; INVALID_ARGUMENT when the geometry
  // is invalid or not even one chunk fits.
  static absl::StatusOr<ChunkAllocator> FromBudget(const KvGeometry& geometry, int64_t budget_bytes);

  // O(1). RESOURCE_EXHAUSTED when no chunk is free. Ids are handed out
  // lowest-first on a fresh pool, then most-recently-freed first (warm memory).
  absl::StatusOr<ChunkId> Allocate();
  // O(1). FAILED_PRECONDITION when `id` is out of range or already free.
  absl::Status Free(ChunkId id);

  bool IsAllocated(ChunkId id) const { return id >= 0 && id < capacity() && allocated_[id]; }
  int32_t capacity() const { return static_cast<int32_t>(allocated_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t num_allocated() const { return capacity() - num_free(); }

 private:
  std::vector<ChunkId> free_list_;  // stack; back() is handed out next
  std::vector<uint8_t> allocated_;  // (capacity) 1 while handed out
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_CHUNK_ALLOCATOR_H_
