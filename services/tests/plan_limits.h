// The limits a worker enforces on every StepPlan, checked where plans are
// made: the CUDA worker sizes its workspace for --max_tokens_per_step rows and
// its decode buffers for --max_batch_size sequences, and refuses a step past
// either. A scheduler that planned one row over would fail only on a GPU, so
// the scheduler's tests run this on every plan.
#ifndef CHUNKATTN_SERVICES_TESTS_PLAN_LIMITS_H_
#define CHUNKATTN_SERVICES_TESTS_PLAN_LIMITS_H_

#include <cstdint>

#include "gtest/gtest.h"
#include "proto/plan/step_plan.h"
#include "services/core/scheduler.h"

namespace chunkattn {
namespace testing {

inline void ExpectPlanWithinLimits(const StepPlan& plan, const SchedulerOptions& options) {
  const int64_t rows = static_cast<int64_t>(plan.tokens.size());
  EXPECT_LE(rows, options.max_tokens_per_step) << "step " << plan.step << " plans more rows than the budget";
  const int64_t prefill_rows = plan.prefill.num_tokens();
  EXPECT_LE(prefill_rows, rows) << "step " << plan.step;
  // One decode row per sequence (a prompt's last row is its first decode
  // row, in the same step as the rest of its prefill).
  const int64_t decode_rows = rows - prefill_rows;
  EXPECT_LE(decode_rows, options.max_batch_size) << "step " << plan.step << " decodes more sequences than the batch";
  EXPECT_LE(plan.prefill.num_seqs(), options.max_batch_size) << "step " << plan.step;
}

}  // namespace testing
}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_TESTS_PLAN_LIMITS_H_
