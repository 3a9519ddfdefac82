// A KV chunk's seal (issue 41): the header every KV tier keeps in front of a
// chunk's bytes (Model::ReadChunk's), so a load hands back nothing but what
// was stored under the key asked for. The host and disk tiers' slots
// (kv_tier_store.h) and the shared tier's Redis values (shared_kv_store.h)
// are a seal then the chunk.
//
// Layout: 32 bytes, four u64s in host byte order (every machine we build for
// is little-endian): magic ("CNTTAKV2": a chunk of ours, layout version 2),
// key (the coordinator's key: the block's chained hash), checksum
// (KvChunkChecksum of the bytes seeded with the key) and length (the chunk's
// bytes). A seal of all zeros is a slot never written (a tier's fresh memory
// or sparse file). Version 1 checksummed with HashBytes (base/hash.h).
//
// The checksum is fast, not cryptographic: it catches corruption and values
// that are not what was asked for, not someone who can write the tier
// (SECURITY.md).
#ifndef CHUNKATTN_WORKERS_SERVER_KV_CHUNK_SEAL_H_
#define CHUNKATTN_WORKERS_SERVER_KV_CHUNK_SEAL_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace chunkattn {

struct KvChunkSeal {
  // "CNTTAKV2" read as a little-endian u64; a new layout takes a new version.
  static constexpr uint64_t kMagic = 0x32564b4154544e43ull;
  static constexpr int64_t kBytes = 32;

  uint64_t magic = 0;
  uint64_t key = 0;
  uint64_t checksum = 0;
  uint64_t length = 0;

  // All zeros: a slot never written.
  bool blank() const { return magic == 0 && key == 0 && checksum == 0 && length == 0; }
};
static_assert(sizeof(KvChunkSeal) == KvChunkSeal::kBytes);

// The seal's checksum of `n` bytes under `key`. Every load and store of a
// tier reads a whole chunk through it (a MiB or more), beside the forward
// pass, so it is built to run at memory speed: eight independent lanes over
// 64-byte stripes, each word mixed by one 32x32->64-bit multiply with a
// per-lane, per-stripe secret (a word's position counts); AVX2 where the
// kernels take it (cpu::IsaSupported). 2.6x HashBytes' speed on a MiB in
// cache, 1.9x from memory, on the 2-core EPYC VM. The portable and AVX2
// paths give the same value; `force_portable` is for the test that says so.
uint64_t KvChunkChecksum(const uint8_t* bytes, size_t n, uint64_t key, bool force_portable = false);

// INVALID_ARGUMENT unless a buffer of `size` bytes holds one chunk of
// `chunk_bytes`; `use` says what the buffer is for ("to store", "to load
// into").
absl::Status CheckKvChunkBuffer(int64_t size, int64_t chunk_bytes, std::string_view use);

// The seal of `bytes`, a chunk of `chunk_bytes` stored under `key`:
// INVALID_ARGUMENT for a buffer of another size.
absl::StatusOr<KvChunkSeal> SealKvChunk(uint64_t key, absl::Span<const uint8_t> bytes, int64_t chunk_bytes);

// Whether `seal` is one of a chunk of `chunk_bytes` under `key`, before its
// bytes are read. The first thing wrong, the message starting with `where`
// (e.g. "disk KV tier slot 3"): NOT_FOUND for a blank seal (never written) or
// another key (the slot reused); DATA_LOSS for a wrong magic (not a seal of
// ours, or damaged) or length (damaged).
absl::Status CheckKvChunkSeal(const KvChunkSeal& seal, uint64_t key, int64_t chunk_bytes, std::string_view where);

// DATA_LOSS, starting with `where`, unless `bytes` match the checksum of a
// `seal` that CheckKvChunkSeal passed.
absl::Status CheckKvChunkBytes(const KvChunkSeal& seal, absl::Span<const uint8_t> bytes, std::string_view where);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SERVER_KV_CHUNK_SEAL_H_
