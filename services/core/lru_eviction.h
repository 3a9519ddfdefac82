// The eviction order of a cache of ids (the prefix forest's cached chunks,
// a KV tier's held slots): which one is freed when room is needed. The
// lowest retention priority first (retention.h), then the least recently
// cached. Each id keeps its retention grants whether cached or not, so a
// chunk in use carries what requests gave it into the cached order.
//
// The forest releases a sequence's chunks leaf first, and a request's grants
// cover a prefix (every grant on a chunk is on its parent too), so a cached
// chunk always comes before its cached parent here and the forest's victim
// is always a leaf (PrefixForest::CheckInvariants checks both).
//
// An ordered set keyed by (priority, cache stamp): O(log n) per call. A
// grant that ends re-keys its id at the same stamp (Expire), so LRU within a
// priority stays by cache time. Each entry keeps the time it was cached
// (from the injected clock) for the age of the oldest cached prefix.
//
// Not thread-safe: owned by the forest or the tier map.
#ifndef CHUNKATTN_SERVICES_CORE_LRU_EVICTION_H_
#define CHUNKATTN_SERVICES_CORE_LRU_EVICTION_H_

#include <cstdint>
#include <functional>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "services/core/retention.h"

namespace chunkattn {

class LruEviction {
 public:
  static constexpr int64_t kNone = -1;

  // Ids in [0, capacity). `clock` is borrowed (Clock::Real() when null).
  LruEviction(int64_t capacity, const Clock* clock);

  // `id` became evictable: the most recent of its priority. REQUIRES: not contained.
  void Cached(int64_t id);
  // `id` is in use again, or freed. REQUIRES: contained.
  void Uncached(int64_t id);
  // The id to evict next; kNone when nothing is cached.
  int64_t Victim() const { return order_.empty() ? kNone : std::get<2>(*order_.begin()); }

  bool contains(int64_t id) const { return entries_[id].cached; }
  int64_t size() const { return static_cast<int64_t>(order_.size()); }
  // How long the victim has been cached; zero when nothing is.
  absl::Duration OldestAge() const;

  // Eviction order, for checks: Victim(), then Next() until kNone.
  int64_t Next(int64_t id) const;
  int64_t Prev(int64_t id) const;

  // Retention. Adds `g` to `id`'s grants (cached or not); returns its
  // priority before. Priority(id) is the one after.
  // `now` is the caller's for the whole operation (after Expire(now)), so
  // every id's priority is the one at the same instant.
  int32_t Grant(int64_t id, RetentionGrant g, absl::Time now);
  int32_t Merge(int64_t id, const RetentionGrants& grants, absl::Time now);
  // `id` is freed: its grants go. REQUIRES: not contained.
  void ClearGrants(int64_t id);
  const RetentionGrants& grants(int64_t id) const { return entries_[id].grants; }
  // The priority now, as of the last Grant, Merge or Expire.
  int32_t Priority(int64_t id) const { return entries_[id].priority; }
  // Calls f(id) for each cached id above `priority`, highest first: O(those).
  void ForEachAbove(int32_t priority, absl::FunctionRef<void(int64_t id)> f) const;
  // Ends the grants over by `now` (the clock's, read once by the caller):
  // each id whose priority changed is re-keyed and reported as
  // changed(id, from, to). O(log n) per ended grant.
  void Expire(absl::Time now, absl::FunctionRef<void(int64_t id, int32_t from, int32_t to)> changed);

  const Clock* clock() const { return clock_; }

 private:
  using Key = std::tuple<int32_t, uint64_t, int64_t>;  // (priority, stamp, id)
  struct Entry {
    bool cached = false;
    int32_t priority = kDefaultRetentionPriority;
    uint64_t stamp = 0;
    absl::Time since;
    RetentionGrants grants;
  };
  Key KeyOf(int64_t id) const { return {entries_[id].priority, entries_[id].stamp, id}; }
  // Recomputes `id`'s priority at `now`, re-keying it; returns the old one.
  int32_t Refresh(int64_t id, absl::Time now);

  const Clock* clock_;
  std::vector<Entry> entries_;
  absl::btree_set<Key> order_;
  uint64_t next_stamp_ = 0;
  // (end, id) of each id's next grant to end; stale entries are skipped.
  std::priority_queue<std::pair<absl::Time, int64_t>, std::vector<std::pair<absl::Time, int64_t>>, std::greater<>>
      expiries_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_LRU_EVICTION_H_
