// The prefix forest against a brute-force model (forest_walk.h): seeded
// walks of 20,000 to 100,000 operations on pools from tiny to roomy (a
// quarter under a sanitizer), each of which must visit every kind of event.
#include <random>
#include <string>

#include "base/sanitizer.h"
#include "gtest/gtest.h"
#include "services/tests/forest_walk.h"

namespace chunkattn {
namespace {

using testing::WalkCase;

class PrefixForestRandomWalkTest : public ::testing::TestWithParam<WalkCase> {};

TEST_P(PrefixForestRandomWalkTest, MatchesBruteForceModel) {
  WalkCase c = GetParam();
  c.steps = SanitizerSlice(c.steps, 8);  // an eighth still evicts, shares and forks thousands of times
  std::mt19937 rng(c.seed);
  testing::RandomWalk walk(c.params, [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); });
  for (int step = 0; step < c.steps && !HasFailure(); ++step) walk.Step();
  if (HasFailure()) return;
  walk.Finish();
  const auto v = walk.visited();
  EXPECT_GT(v.inserts_ok, c.steps / 20);
  EXPECT_GT(v.cancelled, 0);
  EXPECT_GT(v.copies, 0);
  EXPECT_GT(v.exhausted, 0);
  EXPECT_GT(walk.forest().stats().total_evictions, 0);
  EXPECT_GT(walk.forest().stats().total_matched_tokens, 0);
  if (c.params.retention) {
    // Every band was evicted from, and the bound cut some grants.
    EXPECT_GT(v.retained, c.steps / 20);
    EXPECT_GT(v.capped, 0);
    for (int b = 0; b < kNumRetentionBands; ++b) EXPECT_GT(v.band_evictions[b], 0) << RetentionBandName(static_cast<RetentionBand>(b));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Walks, PrefixForestRandomWalkTest,
    ::testing::Values(WalkCase{{16, 48}, 100000, 1}, WalkCase{{32, 40}, 30000, 2}, WalkCase{{64, 24}, 20000, 3},
                      WalkCase{{16, 200}, 20000, 4},
                      // Retention: priorities, ends and the bound against the model.
                      WalkCase{{16, 48, false, true}, 40000, 5}, WalkCase{{32, 24, false, true}, 20000, 6}),
    [](const ::testing::TestParamInfo<WalkCase>& info) {
      return "c" + std::to_string(info.param.params.chunk_size) + "_pool" +
             std::to_string(info.param.params.pool_chunks) + "_steps" + std::to_string(info.param.steps) +
             (info.param.params.retention ? "_retention" : "");
    });

}  // namespace
}  // namespace chunkattn
