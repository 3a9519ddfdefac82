#include "workers/server/kv_chunk_seal.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/strings/str_format.h"
#include "base/hash.h"
#include "base/status_macros.h"
#include "kernels/cpu/attention.h"

namespace chunkattn {
namespace {

constexpr int kLanes = 8;  // u64 lanes: a stripe is 64 bytes

struct Lanes {
  uint64_t acc[kLanes];
  uint64_t secret[kLanes];
};

Lanes Start(uint64_t key) {
  Lanes l;
  for (int i = 0; i < kLanes; ++i) {
    l.acc[i] = SplitMix64(key + static_cast<uint64_t>(i) * kMix64M2);
    l.secret[i] = SplitMix64(key ^ (static_cast<uint64_t>(i + 1) * kMix64M1));
  }
  return l;
}

// Stripe s's word w in lane i: x = w ^ (secret[i] + s * kGoldenGamma),
// acc[i] += lo32(x) * hi32(x) + w. The product mixes the word with its
// position; the sum keeps every bit of it (a product of a zero half is 0).
void StripesPortable(Lanes& l, const uint8_t* p, size_t stripes) {
  for (size_t s = 0; s < stripes; ++s) {
    const uint64_t salt = static_cast<uint64_t>(s) * kGoldenGamma;
    for (int i = 0; i < kLanes; ++i) {
      uint64_t w;
      std::memcpy(&w, p + s * 64 + i * 8, 8);
      const uint64_t x = w ^ (l.secret[i] + salt);
      l.acc[i] += (x & 0xFFFFFFFFull) * (x >> 32) + w;
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void StripesAvx2(Lanes& l, const uint8_t* p, size_t stripes) {
  __m256i acc0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.acc));
  __m256i acc1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.acc + 4));
  __m256i key0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.secret));
  __m256i key1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.secret + 4));
  const __m256i gamma = _mm256_set1_epi64x(static_cast<long long>(kGoldenGamma));
  for (size_t s = 0; s < stripes; ++s) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + s * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + s * 64 + 32));
    const __m256i x0 = _mm256_xor_si256(w0, key0), x1 = _mm256_xor_si256(w1, key1);
    acc0 = _mm256_add_epi64(acc0, _mm256_add_epi64(_mm256_mul_epu32(x0, _mm256_srli_epi64(x0, 32)), w0));
    acc1 = _mm256_add_epi64(acc1, _mm256_add_epi64(_mm256_mul_epu32(x1, _mm256_srli_epi64(x1, 32)), w1));
    key0 = _mm256_add_epi64(key0, gamma);  // the next stripe's salt
    key1 = _mm256_add_epi64(key1, gamma);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(l.acc), acc0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(l.acc + 4), acc1);
}

#endif

}  // namespace

uint64_t KvChunkChecksum(const uint8_t* bytes, size_t n, uint64_t key, bool force_portable) {
  Lanes l = Start(key);
  const size_t stripes = n / 64;
#if defined(__x86_64__)
  if (!force_portable && cpu::IsaSupported(cpu::Isa::kAvx2)) {  // asked of the CPU once
    StripesAvx2(l, bytes, stripes);
  } else {
    StripesPortable(l, bytes, stripes);
  }
#else
  (void)force_portable;
  StripesPortable(l, bytes, stripes);
#endif
  uint64_t h = Mix64(key ^ (static_cast<uint64_t>(n) * kMix64M1));
  for (int i = 0; i < kLanes; ++i) h = Mix64(h ^ l.acc[i]);
  // The bytes past the last whole stripe.
  return HashBytes(bytes + stripes * 64, n - stripes * 64, h);
}

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
  seal.checksum = KvChunkChecksum(bytes.data(), bytes.size(), key);
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
  if (bytes.size() != seal.length || KvChunkChecksum(bytes.data(), bytes.size(), seal.key) != seal.checksum) {
    return absl::DataLossError(absl::StrFormat("%s: its bytes do not match their checksum", where));
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
