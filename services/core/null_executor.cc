#include "services/core/null_executor.h"

#include "base/hash.h"

namespace chunkattn {

void NullExecute(const StepPlan& plan, StepResult* result) {
  result->step = plan.step;
  result->tokens.clear();
  result->logprobs.clear();
  result->top_token_ids.clear();
  result->top_logprobs.clear();
  result->compute_seconds = 0;
  for (size_t k = 0; k < plan.samples.size(); ++k) {
    const uint64_t h = SplitMix64(plan.step * kGoldenGamma + k);
    result->tokens.push_back(static_cast<int32_t>(3 + h % 31997));
    result->logprobs.push_back(0);
  }
}

}  // namespace chunkattn
