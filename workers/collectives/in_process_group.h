// A communicator group whose ranks are threads of one process: the oracle
// and test double for the tensor-parallel path (the Gloo group must agree
// with it).
//
// AllReduceSum adds in fixed rank order, ((x0 + x1) + x2) + ..., for every
// element, so results are deterministic and bit-identical on every rank.
// Each call is two barriers: after the first every rank has published its
// buffer, and rank r sums elements [r*n/W, (r+1)*n/W) of all buffers and
// writes the sum into all of them; the second ensures every slice is done
// before any rank returns. Ranks therefore share the summing work and no
// scratch copy is made.
//
// Calls whose kinds or sizes disagree across ranks (a caller bug) return
// INVALID_ARGUMENT on every rank without touching any buffer.
#ifndef CHUNKATTN_WORKERS_COLLECTIVES_IN_PROCESS_GROUP_H_
#define CHUNKATTN_WORKERS_COLLECTIVES_IN_PROCESS_GROUP_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "workers/collectives/communicator.h"

namespace chunkattn {

// Returns world_size communicators, element r being rank r. Each is to be
// used by its own thread (see communicator.h); they share state that lives
// until the last one is destroyed.
// `timeout`: how long a rank waits at a barrier for the others before the
// group is declared broken (DEADLINE_EXCEEDED for the rank that waited,
// UNAVAILABLE for the rest).
// REQUIRES: world_size >= 1; timeout > 0 (else INVALID_ARGUMENT).
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> MakeInProcessGroup(
    int world_size, absl::Duration timeout = absl::Seconds(60));

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_COLLECTIVES_IN_PROCESS_GROUP_H_
