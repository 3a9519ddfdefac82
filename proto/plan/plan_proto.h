// StepPlan / StepResult <-> worker.proto, at the gRPC boundary only (the
// coordinator's worker pool, the worker's service). A plan from the network
// is checked field by field where it is run (PlanExecutor); here only what
// its C++ form cannot hold: the KV moves' enums and signs.
#ifndef CHUNKATTN_PROTO_PLAN_PLAN_PROTO_H_
#define CHUNKATTN_PROTO_PLAN_PLAN_PROTO_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "chunkattn/internal/v1/worker.pb.h"
#include "proto/plan/step_plan.h"

namespace chunkattn {

// Metadata of the Execute call naming the session (JoinRequest.session) the
// stream belongs to; a worker refuses a stream for any other.
inline constexpr char kSessionMetadata[] = "chunkattn-session";

void ToProto(const StepPlan& plan, internal::v1::StepPlan* out);
// Overwrites every field of `out`, reusing its vectors' memory.
// INVALID_ARGUMENT for a move of an unknown kind or tier, or with a negative
// slot (to_slot of a demote) or chunk (of a store or load); `out` is then
// unspecified.
absl::Status FromProto(const internal::v1::StepPlan& plan, StepPlan* out);

// The masks_only message of a plan whose masks follow (its samples'
// `allowed`, in order), and back into `masks` (one per sample of the plan
// in flight). INVALID_ARGUMENT for a message that is not that step's masks.
void MasksToProto(const StepPlan& plan, internal::v1::StepPlan* out);
absl::Status MasksFromProto(const internal::v1::StepPlan& wire, uint64_t step, size_t samples,
                            std::vector<std::vector<uint32_t>>* masks);

void ToProto(const StepResult& result, internal::v1::StepResult* out);
void FromProto(const internal::v1::StepResult& result, StepResult* out);

}  // namespace chunkattn

#endif  // CHUNKATTN_PROTO_PLAN_PLAN_PROTO_H_
