// Tensor-parallel collectives: the few group operations a worker needs to
// combine its head shard with the other ranks' (the row-parallel projections
// all-reduce their partial sums twice per layer per step).
//
// Implementations: MakeSingleRankCommunicator() (world 1, no-ops), an
// in-process group for tests (in_process_group.h) and Gloo over TCP for
// separate worker processes (gloo_communicator.h).
//
// Contract shared by every implementation:
//  - Collective calls are matched by order, not by name: every rank makes the
//    same sequence of calls with the same sizes (and the same root).
//  - A collective that cannot complete (a peer is gone, or does not arrive
//    within the communicator's timeout) returns UNAVAILABLE or
//    DEADLINE_EXCEEDED. It never hangs forever and never throws. After such a
//    failure the communicator is broken: later calls return UNAVAILABLE, and
//    the group must be rebuilt.
//  - INVALID_ARGUMENT is a local check that failed before any communication
//    (null buffer, negative size, root out of range); this rank did not take
//    part, so its peers will time out unless they fail the same check. The
//    in-process group also returns it on every rank when the ranks' calls
//    disagree (kind, size or root); Gloo cannot detect that, and the call
//    fails or times out instead.
//  - A size of zero is a no-op that does not communicate; since every rank
//    passes the same size, all of them skip it.
//
// Thread safety: a Communicator is thread-compatible. One thread (the
// worker's) calls it; calls must not overlap. Different ranks' communicators
// may be used concurrently from different threads.
#ifndef CHUNKATTN_WORKERS_COLLECTIVES_COMMUNICATOR_H_
#define CHUNKATTN_WORKERS_COLLECTIVES_COMMUNICATOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"

namespace chunkattn {

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's rank in [0, world_size()).
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place: data[k] becomes the sum over all ranks of their data[k].
  // After it returns OK every rank holds bit-identical values.
  // data: (n) floats, host memory, owned by the caller.
  // REQUIRES: n >= 0; data != nullptr when n > 0.
  virtual absl::Status AllReduceSum(float* data, int64_t n) = 0;

  // Copies `bytes` bytes at `data` on rank `root` into `data` on every other
  // rank. REQUIRES: bytes >= 0; 0 <= root < world_size().
  virtual absl::Status Broadcast(void* data, int64_t bytes, int root) = 0;

  // Returns once every rank has entered Barrier().
  virtual absl::Status Barrier() = 0;
};

// A group of one: AllReduceSum and Barrier do nothing, Broadcast accepts
// only root 0. Argument checks still apply.
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_COLLECTIVES_COMMUNICATOR_H_
