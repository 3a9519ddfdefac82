#include "workers/server/kv_chunk_seal.h"

#include "absl/strings/str_format.h"
#include "base/hash.h"
#include "base/status_macros.h"

namespace chunkattn {

absl::Status CheckKvChunkBuffer(int64_t size, int64_t chunk_bytes, std::string_view use) {
  if (size != chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a KV chunk is %d bytes, the buffer %s %d", chunk_bytes, use, size));
  }
  return absl::OkStatus();
}

absl::StatusOr<KvChunkSeal> SealKvChunk(uint64_t key, absl::Span<const uint8_t> bytes, int64_t chunk_bytes) {
  RETURN_IF_ERROR(CheckKvChunkBuffer(static_cast<int64_t>(bytes.size()), chunk_bytes, "to store"));
  KvChunkSeal seal;
  seal.magic = KvChunkSeal::kMagic;
  seal.key = key;
  seal.checksum = HashBytes(bytes.data(), bytes.size(), key);
  seal.length = static_cast<uint64_t>(chunk_bytes);
  return seal;
}

absl::Status CheckKvChunkSeal(const KvChunkSeal& seal, uint64_t key, int64_t chunk_bytes, std::string_view where) {
  if (seal.blank()) return absl::NotFoundError(absl::StrFormat("%s was never written", where));
  if (seal.magic != KvChunkSeal::kMagic) {
    return absl::DataLossError(
        absl::StrFormat("%s: magic %016x, not a KV chunk seal's %016x", where, seal.magic, KvChunkSeal::kMagic));
  }
  if (seal.key != key) {
    return absl::NotFoundError(absl::StrFormat("%s holds key %016x, not %016x", where, seal.key, key));
  }
  if (seal.length != static_cast<uint64_t>(chunk_bytes)) {
    return absl::DataLossError(absl::StrFormat("%s: length %d bytes, a chunk is %d", where, seal.length, chunk_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckKvChunkBytes(const KvChunkSeal& seal, absl::Span<const uint8_t> bytes, std::string_view where) {
  if (bytes.size() != seal.length || HashBytes(bytes.data(), bytes.size(), seal.key) != seal.checksum) {
    return absl::DataLossError(absl::StrFormat("%s: its bytes do not match their checksum", where));
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
