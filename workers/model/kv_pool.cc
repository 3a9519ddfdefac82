#include "workers/model/kv_pool.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace chunkattn {

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const KvGeometry& s, int64_t num_chunks) {
  if (!s.IsValid() || num_chunks < 1 || num_chunks > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV pool: layers %d, kv heads %d, head dim %d (each in [1, 1024]), chunk size %d (a power of two in "
        "[16, 256]) and %d chunks",
        s.num_layers, s.num_kv_heads, s.head_dim, s.chunk_size, num_chunks));
  }
  std::unique_ptr<KvPool> pool(new KvPool(s, num_chunks));
  pool->layer_bytes_ = num_chunks * s.ChunkElementsPerLayer() * DTypeBytes(s.dtype);
  const int64_t total = pool->layer_bytes_ * 2 * s.num_layers;
  // 64-byte aligned for the vector loads of the kernels.
  void* p = std::aligned_alloc(64, static_cast<size_t>((total + 63) / 64 * 64));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV pool: cannot allocate %d bytes for %d chunks", total, num_chunks));
  }
  // Zeroed so a kernel bug that reads an unwritten slot is at least repeatable.
  std::memset(p, 0, static_cast<size_t>(total));
  pool->data_.reset(static_cast<uint8_t*>(p));
  return pool;
}

KvPoolView KvPool::Layer(int layer) const {
  KvPoolView v;
  v.k = data_.get() + (2 * int64_t{layer}) * layer_bytes_;
  v.v = data_.get() + (2 * int64_t{layer} + 1) * layer_bytes_;
  v.dtype = shape_.dtype;
  v.num_chunks = num_chunks_;
  v.num_kv_heads = shape_.num_kv_heads;
  v.chunk_size = shape_.chunk_size;
  v.head_dim = shape_.head_dim;
  return v;
}

absl::Status KvPool::Copy(absl::Span<const KvCopy> copies) {
  RETURN_IF_ERROR(ValidateKvCopies(copies, num_chunks_, shape_.chunk_size));
  const int64_t row = int64_t{shape_.head_dim} * DTypeBytes(shape_.dtype);
  const int64_t head = row * shape_.chunk_size;
  const int64_t chunk = head * shape_.num_kv_heads;
  for (const KvCopy& c : copies) {
    if (c.src_chunk == c.dst_chunk) continue;
    for (int64_t buf = 0; buf < 2 * shape_.num_layers; ++buf) {
      uint8_t* base = data_.get() + buf * layer_bytes_;
      for (int h = 0; h < shape_.num_kv_heads; ++h) {
        std::memcpy(base + c.dst_chunk * chunk + h * head, base + c.src_chunk * chunk + h * head,
                    static_cast<size_t>(c.num_tokens * row));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KvPool::CheckChunkBuffer(int64_t chunk, size_t bytes) const {
  if (chunk < 0 || chunk >= num_chunks_) {
    return absl::InvalidArgumentError(absl::StrFormat("KV chunk %d is outside the pool's [0, %d)", chunk, num_chunks_));
  }
  if (static_cast<int64_t>(bytes) != shape_.BytesPerChunk()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a KV chunk is %d bytes, the buffer %d", shape_.BytesPerChunk(), bytes));
  }
  return absl::OkStatus();
}

absl::Status KvPool::ReadChunk(int64_t chunk, absl::Span<uint8_t> out) const {
  RETURN_IF_ERROR(CheckChunkBuffer(chunk, out.size()));
  // A chunk is contiguous in each layer's K and V: 2 * num_layers copies.
  const int64_t slice = shape_.ChunkElementsPerLayer() * DTypeBytes(shape_.dtype);
  for (int64_t buf = 0; buf < 2 * shape_.num_layers; ++buf) {
    std::memcpy(out.data() + buf * slice, data_.get() + buf * layer_bytes_ + chunk * slice, static_cast<size_t>(slice));
  }
  return absl::OkStatus();
}

absl::Status KvPool::WriteChunk(int64_t chunk, absl::Span<const uint8_t> in) {
  RETURN_IF_ERROR(CheckChunkBuffer(chunk, in.size()));
  const int64_t slice = shape_.ChunkElementsPerLayer() * DTypeBytes(shape_.dtype);
  for (int64_t buf = 0; buf < 2 * shape_.num_layers; ++buf) {
    std::memcpy(data_.get() + buf * layer_bytes_ + chunk * slice, in.data() + buf * slice, static_cast<size_t>(slice));
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
