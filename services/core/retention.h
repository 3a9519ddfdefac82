// Retention controls (issue 41; TensorRT-LLM's KvCacheRetentionConfig): a
// request may give the blocks of its prompt's first tokens a retention
// priority until a time. Eviction, in the pool and in every KV tier, takes
// the lowest priority first and the least recently used within a priority.
//
// The scale is TensorRT-LLM's, 35 when nobody said otherwise, and a request
// may ask for [35, 100]: later eviction, never earlier. (A prefix evicted
// sooner would have to take every block built on it along, whoever's they
// are: a block is of use only below its parent. Since every grant covers a
// prefix and none is below the default, a block's priority is never above
// its parent's, so the pool's victim is always a leaf.)
//
// Grants accumulate per block, none shortens another: a block's priority at
// time t is the highest priority among its grants still running at t, or
// the default when none is. A later request raising a block's priority or
// extending its time therefore extends it, and one asking less changes
// nothing while a stronger grant runs (it takes over when that one ends, if
// it lasts longer).
#ifndef CHUNKATTN_SERVICES_CORE_RETENTION_H_
#define CHUNKATTN_SERVICES_CORE_RETENTION_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace chunkattn {

inline constexpr int32_t kDefaultRetentionPriority = 35;
inline constexpr int32_t kMinRetentionPriority = kDefaultRetentionPriority;
inline constexpr int32_t kMaxRetentionPriority = 100;
// The longest a grant may run: a tenant's system prompt kept for a month
// at most (the per-tenant bound caps how much, this caps how long).
inline constexpr absl::Duration kMaxRetentionDuration = absl::Hours(24 * 30);

// One grant on a block.
struct RetentionGrant {
  int32_t priority = kDefaultRetentionPriority;
  absl::Time until = absl::InfiniteFuture();  // the grant ends at `until` (exclusive)
  friend bool operator==(const RetentionGrant& a, const RetentionGrant& b) {
    return a.priority == b.priority && a.until == b.until;
  }
};

// A request's retention (RequestSpec::retention; the fronts' "retention"
// fields, named after TensorRT-LLM's TokenRangeRetentionConfig).
struct RetentionSpec {
  int32_t priority = kDefaultRetentionPriority;         // [kMinRetentionPriority, kMaxRetentionPriority]
  absl::Duration duration = absl::InfiniteDuration();  // from the request's arrival; (0, kMaxRetentionDuration] or infinite
  int32_t prefix_tokens = 0;                           // the prompt's first tokens it covers; 0: the whole prompt
};

// Priority bands, for metrics: at and above the default.
enum class RetentionBand : uint8_t { kDefault = 0, kHigh = 1 };
inline constexpr int kNumRetentionBands = 2;
inline RetentionBand BandOf(int32_t priority) {
  return priority > kDefaultRetentionPriority ? RetentionBand::kHigh : RetentionBand::kDefault;
}
const char* RetentionBandName(RetentionBand band);  // "default", "high"

// The grants on one block, kept as the few that matter: no grant both
// lower and shorter than another (priority descending, end ascending), so
// at most one per priority and usually one in all. Copyable value.
class RetentionGrants {
 public:
  // Adds `g` (priorities outside the scale are clamped into it).
  void Add(RetentionGrant g);
  void Merge(const RetentionGrants& other);
  // Drops the grants that ended at or before `now`.
  void Expire(absl::Time now);
  // The priority at `now`: the highest of the grants running then, else the default.
  int32_t PriorityAt(absl::Time now) const;
  // When PriorityAt next changes after the last Expire (InfiniteFuture: never).
  absl::Time NextChange() const {
    return grants_.empty() ? absl::InfiniteFuture() : grants_.front().until;
  }
  bool empty() const { return grants_.empty(); }
  void clear() { grants_.clear(); }
  const std::vector<RetentionGrant>& grants() const { return grants_; }

 private:
  std::vector<RetentionGrant> grants_;  // priority descending, until ascending
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_RETENTION_H_
