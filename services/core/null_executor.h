// The executor that computes nothing, for running the Scheduler without a
// model (the cache replay, the per-step cost benchmark): every sample of a
// plan gets a token drawn from (step, sample) in [3, 32000), never an id the
// callers use as EOS, so each request runs for exactly its max_new_tokens.
#ifndef CHUNKATTN_SERVICES_CORE_NULL_EXECUTOR_H_
#define CHUNKATTN_SERVICES_CORE_NULL_EXECUTOR_H_

#include "proto/plan/step_plan.h"

namespace chunkattn {

// Fills `result` (reusing its memory) as a worker would answer `plan`, with
// no top_logprobs entries: its requests must not ask for them.
void NullExecute(const StepPlan& plan, StepResult* result);

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_NULL_EXECUTOR_H_
