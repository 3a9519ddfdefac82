// Helpers shared by the communicator implementations; not a public API.
#ifndef CHUNKATTN_WORKERS_COLLECTIVES_INTERNAL_H_
#define CHUNKATTN_WORKERS_COLLECTIVES_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace chunkattn {
namespace collectives_internal {

// The local REQUIRES checks of communicator.h, done before communicating.
absl::Status CheckAllReduceArgs(const float* data, int64_t n);
absl::Status CheckBroadcastArgs(const void* data, int64_t bytes, int root,
                                int world_size);

}  // namespace collectives_internal
}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_COLLECTIVES_INTERNAL_H_
