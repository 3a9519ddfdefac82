// What the coordinator's engine drives: the tensor-parallel workers, joined
// into a session that runs one plan per iteration. WorkerPool is the real one
// (gRPC to worker processes); tests run the engine on in-process workers,
// which lets ThreadSanitizer check the engine's threads without gRPC (whose
// Debian build is not instrumented).
//
// Thread-compatible: called from the engine's loop thread only.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_WORKER_GROUP_H_
#define CHUNKATTN_SERVICES_COORDINATOR_WORKER_GROUP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/plan/step_plan.h"

namespace chunkattn {

class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;

  // Joins every worker into a fresh session (new, empty KV pools).
  // UNAVAILABLE while some worker cannot be reached or refuses.
  virtual absl::Status Connect() = 0;
  // Ends the session; Connect() starts over.
  virtual void Disconnect() = 0;
  // A cheap liveness check of every worker without a step (for an idle
  // engine): OK, or UNAVAILABLE naming the first that is gone or refusing.
  virtual absl::Status Probe() = 0;
  // Runs one plan on every rank and returns the sampling rank's result, its
  // failed_moves the union of every rank's (a chunk is whole only if every
  // rank moved its shard).
  // With plan->masks_follow, `fill_masks(plan)` fills the samples' masks on
  // the caller's thread once the plan is on its way to the ranks (which run
  // its forward pass meanwhile), and they follow it to the sampling rank.
  // UNAVAILABLE when any rank fails; the group is then disconnected.
  virtual absl::StatusOr<StepResult> Step(StepPlan* plan, const std::function<void(StepPlan*)>& fill_masks) = 0;
  // A worker that said in the last step result that it is shutting down
  // (it serves on until released by Disconnect); empty if none.
  virtual const std::string& draining() const = 0;

  // The session's figures, valid after a successful Connect().
  virtual int world_size() const = 0;
  virtual int64_t num_chunks() const = 0;
  virtual int64_t chunk_bytes_total() const = 0;  // one chunk over all ranks
  virtual const std::string& dtype() const = 0;
  virtual const std::string& device() const = 0;
  virtual const std::string& kv_dtype() const = 0;
  // Slots of the KV tiers below the pool (issue 41) that every rank has: the
  // fewest any rank reported; 0 = the tier is off (the default: a group
  // without tiers).
  virtual int64_t host_kv_slots() const { return 0; }
  virtual int64_t disk_kv_slots() const { return 0; }
  // Per rank, the prefix of its keys in the shared KV tier (JoinResponse's
  // kv_store_key_prefix); empty: no shared tier.
  virtual const std::vector<std::string>& kv_store_key_prefixes() const {
    static const std::vector<std::string> kNone;
    return kNone;
  }
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_WORKER_GROUP_H_
