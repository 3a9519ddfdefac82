// Shared by the collectives tests: running every rank on its own thread, and
// reproducible per-rank inputs.
#ifndef CHUNKATTN_WORKERS_COLLECTIVES_TESTS_TEST_UTIL_H_
#define CHUNKATTN_WORKERS_COLLECTIVES_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "workers/collectives/communicator.h"

namespace chunkattn::testing {

// Calls fn(rank's communicator) on one thread per rank and joins them.
inline void RunRanks(const std::vector<std::unique_ptr<Communicator>>& comms,
                     const std::function<void(Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (const auto& comm : comms) threads.emplace_back([&fn, &comm] { fn(*comm); });
  for (auto& t : threads) t.join();
}

// Rank r's input for step `step`, uniform in [-half_width, half_width): the
// same on whichever thread makes it.
inline std::vector<float> RandomInput(int r, int step, int64_t n, float half_width = 1.0f) {
  std::mt19937 rng(static_cast<uint32_t>(step * 1009 + r));
  std::uniform_real_distribution<float> dist(-half_width, half_width);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_WORKERS_COLLECTIVES_TESTS_TEST_UTIL_H_
