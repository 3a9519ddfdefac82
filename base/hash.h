// SplitMix64 (Steele, Lea and Flood), the one integer mix of the project: the
// dummy weights, the sampler's per-step draws and the samples' seeds all
// derive from it, so their streams stay reproducible across the CPU and GPU.
#ifndef CHUNKATTN_BASE_HASH_H_
#define CHUNKATTN_BASE_HASH_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/host_device.h"

namespace chunkattn {

inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd
// Mix64's odd multipliers, which the byte hashes reuse.
inline constexpr uint64_t kMix64M1 = 0xBF58476D1CE4E5B9ull;
inline constexpr uint64_t kMix64M2 = 0x94D049BB133111EBull;

// SplitMix64's finalizer (Stafford's mix 13): a bijection whose output bits
// each depend on every input bit.
CHUNKATTN_HOST_DEVICE constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * kMix64M1;
  z = (z ^ (z >> 27)) * kMix64M2;
  return z ^ (z >> 31);
}

// SplitMix64's output for state `x`.
CHUNKATTN_HOST_DEVICE constexpr uint64_t SplitMix64(uint64_t x) { return Mix64(x + kGoldenGamma); }

// A fast 64-bit hash of `n` bytes (host only): four independent
// multiply-rotate lanes over 32-byte stripes, folded and finished by Mix64,
// so it runs at memory speed on a KV chunk. For checksums (a KV tier's
// slots, workers/server/kv_tier_store.h), not against an adversary. Reads
// words in the machine's byte order: stable across processes on one host
// kind, not across endianness.
inline uint64_t HashBytes(const void* data, size_t n, uint64_t seed = 0) {
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  auto load = [](const unsigned char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
  };
  auto step = [&](uint64_t acc, uint64_t word) { return rotl(acc + word * kMix64M2, 31) * kMix64M1; };
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t a = seed + kGoldenGamma, b = seed ^ kMix64M1, c = seed + kMix64M2, d = seed - kGoldenGamma;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = step(a, load(p + i));
    b = step(b, load(p + i + 8));
    c = step(c, load(p + i + 16));
    d = step(d, load(p + i + 24));
  }
  uint64_t h = Mix64(rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18) + n);
  for (; i + 8 <= n; i += 8) h = Mix64(h ^ step(0, load(p + i)));
  if (i < n) {
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    h = Mix64(h ^ step(n - i, tail));
  }
  return Mix64(h + kGoldenGamma);
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_HASH_H_
