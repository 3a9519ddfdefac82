#include "services/core/retention.h"

#include <algorithm>

namespace chunkattn {

const char* RetentionBandName(RetentionBand band) {
  switch (band) {
    case RetentionBand::kDefault:
      return "default";
    case RetentionBand::kHigh:
      return "high";
  }
  return "default";
}

void RetentionGrants::Add(RetentionGrant g) {
  g.priority = std::clamp(g.priority, kMinRetentionPriority, kMaxRetentionPriority);
  // Dominated by a grant at least as high that lasts at least as long: nothing to keep.
  for (const RetentionGrant& h : grants_) {
    if (h.priority >= g.priority && h.until >= g.until) return;
  }
  // Drop those it dominates, then insert in priority order; ends stay ascending.
  grants_.erase(std::remove_if(grants_.begin(), grants_.end(),
                               [&](const RetentionGrant& h) { return h.priority <= g.priority && h.until <= g.until; }),
                grants_.end());
  auto at = std::find_if(grants_.begin(), grants_.end(),
                         [&](const RetentionGrant& h) { return h.priority < g.priority; });
  grants_.insert(at, g);
}

void RetentionGrants::Merge(const RetentionGrants& other) {
  for (const RetentionGrant& g : other.grants_) Add(g);
}

void RetentionGrants::Expire(absl::Time now) {
  // Ends ascend, so the ended grants are a prefix.
  auto keep = std::find_if(grants_.begin(), grants_.end(), [&](const RetentionGrant& g) { return g.until > now; });
  grants_.erase(grants_.begin(), keep);
}

int32_t RetentionGrants::PriorityAt(absl::Time now) const {
  for (const RetentionGrant& g : grants_) {
    if (g.until > now) return g.priority;
  }
  return kDefaultRetentionPriority;
}

}  // namespace chunkattn
