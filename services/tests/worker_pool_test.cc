// The step deadline the worker pool derives from the steps just run
// (AdaptiveStepTimeout): the rest of the pool needs workers and is tested
// through real processes (tests/services/test_worker_failure.py).
#include <deque>

#include "gtest/gtest.h"
#include "services/coordinator/worker_pool.h"

namespace chunkattn {
namespace {

std::deque<absl::Duration> Steps(size_t n, absl::Duration each) { return std::deque<absl::Duration>(n, each); }

TEST(AdaptiveStepTimeoutTest, TwentyTimesTheSlowestWithinBounds) {
  // A session's first steps (warm-up, graph capture): generous.
  EXPECT_EQ(AdaptiveStepTimeout({}), absl::Seconds(60));
  EXPECT_EQ(AdaptiveStepTimeout(Steps(kStepHistory / 8 - 1, absl::Milliseconds(1))), absl::Seconds(60));
  // Fast steps: the floor, so a hang is noticed in seconds.
  EXPECT_EQ(AdaptiveStepTimeout(Steps(kStepHistory / 8, absl::Milliseconds(10))), absl::Seconds(5));
  // One slow step among fast ones sets it: a slow but live worker is not killed.
  std::deque<absl::Duration> mixed = Steps(kStepHistory, absl::Milliseconds(20));
  mixed[17] = absl::Milliseconds(1500);
  EXPECT_EQ(AdaptiveStepTimeout(mixed), absl::Seconds(30));
  // Very slow steps: the cap.
  EXPECT_EQ(AdaptiveStepTimeout(Steps(kStepHistory, absl::Seconds(10))), absl::Seconds(120));
}

}  // namespace
}  // namespace chunkattn
