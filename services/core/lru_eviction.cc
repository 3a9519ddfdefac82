#include "services/core/lru_eviction.h"

namespace chunkattn {

LruEviction::LruEviction(int64_t capacity, const Clock* clock)
    : clock_(clock != nullptr ? clock : Clock::Real()), entries_(static_cast<size_t>(capacity)) {}

void LruEviction::Cached(int64_t id) {
  Entry& e = entries_[id];
  e.cached = true;
  e.stamp = next_stamp_++;
  e.since = clock_->Now();
  order_.insert(KeyOf(id));
}

void LruEviction::Uncached(int64_t id) {
  order_.erase(KeyOf(id));
  entries_[id].cached = false;
}

absl::Duration LruEviction::OldestAge() const {
  if (order_.empty()) return absl::ZeroDuration();
  return clock_->Now() - entries_[Victim()].since;
}

int64_t LruEviction::Next(int64_t id) const {
  auto it = order_.upper_bound(KeyOf(id));
  return it == order_.end() ? kNone : std::get<2>(*it);
}

int64_t LruEviction::Prev(int64_t id) const {
  auto it = order_.lower_bound(KeyOf(id));
  return it == order_.begin() ? kNone : std::get<2>(*std::prev(it));
}

int32_t LruEviction::Refresh(int64_t id, absl::Time now) {
  Entry& e = entries_[id];
  const int32_t before = e.priority;
  e.grants.Expire(now);
  const int32_t after = e.grants.PriorityAt(now);
  if (after != before) {
    if (e.cached) order_.erase(KeyOf(id));
    e.priority = after;
    if (e.cached) order_.insert(KeyOf(id));
  }
  const absl::Time next = e.grants.NextChange();
  if (next != absl::InfiniteFuture()) expiries_.emplace(next, id);
  return before;
}

int32_t LruEviction::Grant(int64_t id, RetentionGrant g, absl::Time now) {
  entries_[id].grants.Add(g);
  return Refresh(id, now);
}

int32_t LruEviction::Merge(int64_t id, const RetentionGrants& grants, absl::Time now) {
  entries_[id].grants.Merge(grants);
  return Refresh(id, now);
}

void LruEviction::ClearGrants(int64_t id) {
  Entry& e = entries_[id];
  e.grants.clear();
  e.priority = kDefaultRetentionPriority;  // its queued expiries go stale
}

void LruEviction::ForEachAbove(int32_t priority, absl::FunctionRef<void(int64_t id)> f) const {
  for (auto it = order_.rbegin(); it != order_.rend() && std::get<0>(*it) > priority; ++it) f(std::get<2>(*it));
}

void LruEviction::Expire(absl::Time now, absl::FunctionRef<void(int64_t id, int32_t from, int32_t to)> changed) {
  while (!expiries_.empty() && expiries_.top().first <= now) {
    const auto [at, id] = expiries_.top();
    expiries_.pop();
    // Stale: the id's grants changed since (cleared, or a later Refresh queued its own).
    if (entries_[id].grants.NextChange() != at) continue;
    const int32_t before = Refresh(id, now);
    if (entries_[id].priority != before) changed(id, before, entries_[id].priority);
  }
}

}  // namespace chunkattn
