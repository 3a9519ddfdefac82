// n random bytes: a KV chunk's contents for the chunk, tier and store tests.
#ifndef CHUNKATTN_WORKERS_TESTS_RANDOM_BYTES_H_
#define CHUNKATTN_WORKERS_TESTS_RANDOM_BYTES_H_

#include <cstdint>
#include <random>
#include <vector>

namespace chunkattn {

inline std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, int64_t n) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_TESTS_RANDOM_BYTES_H_
