// SplitMix64 (Steele, Lea and Flood), the one integer mix of the project: the
// dummy weights, the sampler's per-step draws and the samples' seeds all
// derive from it, so their streams stay reproducible across the CPU and GPU.
#ifndef CHUNKATTN_BASE_HASH_H_
#define CHUNKATTN_BASE_HASH_H_

#include <cstdint>

#include "base/host_device.h"

namespace chunkattn {

inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd

// SplitMix64's finalizer (Stafford's mix 13): a bijection whose output bits
// each depend on every input bit.
CHUNKATTN_HOST_DEVICE constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// SplitMix64's output for state `x`.
CHUNKATTN_HOST_DEVICE constexpr uint64_t SplitMix64(uint64_t x) { return Mix64(x + kGoldenGamma); }

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_HASH_H_
