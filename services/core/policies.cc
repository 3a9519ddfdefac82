#include "services/core/policies.h"

namespace chunkattn {

AdmissionKey AdmissionPolicy::Key(const QueuedRequest& r) const {
  const int64_t arrival_us = absl::ToUnixMicros(r.arrival);
  if (aging_ <= absl::ZeroDuration()) return {r.priority, arrival_us, r.sequence};
  // |priority| <= 1e6 and aging <= 8.64e10 us: the product fits in 2^57.
  const int64_t shift = int64_t{r.priority} * absl::ToInt64Microseconds(aging_);
  return {0, arrival_us + shift, r.sequence};
}

int PreemptionPolicy::Victim(absl::Span<const QueuedRequest> running) const {
  int victim = -1;
  AdmissionKey last;
  for (int i = 0; i < static_cast<int>(running.size()); ++i) {
    const AdmissionKey key = order_->Key(running[i]);
    if (victim < 0 || last < key) {
      victim = i;
      last = key;
    }
  }
  return victim;
}

}  // namespace chunkattn
