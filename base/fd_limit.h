// The process's descriptor budget. A server raises its soft limit to the hard
// one at start (Debian's default soft limit is 1024, the hard one often far
// higher), then gives the HTTP front only part of it: running out of
// descriptors stops gRPC 1.51's listener for good (it logs "Failed accept4"
// and never accepts again), so the rest stays in reserve for gRPC, the
// workers' channels, ZMQ and files.
#ifndef CHUNKATTN_BASE_FD_LIMIT_H_
#define CHUNKATTN_BASE_FD_LIMIT_H_

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>

namespace chunkattn {

// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit
// now in force (RLIM_INFINITY as 1 << 20).
inline int64_t RaiseOpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) r = raised;
  }
  return r.rlim_cur == RLIM_INFINITY ? int64_t{1} << 20 : static_cast<int64_t>(r.rlim_cur);
}

// Descriptors kept out of the HTTP front's reach: 256 and a quarter of the
// limit, at most half of it.
inline int64_t ReservedDescriptors(int64_t limit) { return std::min(256 + limit / 4, limit / 2); }

// The HTTP front's default connection cap for a soft limit of `limit`
// descriptors: what the reserve leaves, at most 16,384, at least 16.
inline int DefaultHttpConnections(int64_t limit) {
  return static_cast<int>(std::clamp<int64_t>(limit - ReservedDescriptors(limit), 16, 16384));
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_FD_LIMIT_H_
