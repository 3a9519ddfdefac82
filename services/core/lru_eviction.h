// The prefix forest's eviction choice: which cached chunk (held by no running
// sequence) is freed when an allocation finds no free chunk. Least recently
// cached first. The forest releases a sequence's chunks leaf first, so a
// cached chunk always comes before its cached parent here and the victim is
// always a leaf (PrefixForest::Validate checks both).
//
// An intrusive doubly linked list over chunk ids: O(1) per call and no
// allocation after construction. Each entry keeps the time it was cached
// (from the injected clock) for the age of the oldest cached prefix.
//
// Not thread-safe: owned by the forest.
#ifndef CHUNKATTN_SERVICES_CORE_LRU_EVICTION_H_
#define CHUNKATTN_SERVICES_CORE_LRU_EVICTION_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "base/clock.h"

namespace chunkattn {

class LruEviction {
 public:
  static constexpr int32_t kNone = -1;

  // Ids in [0, capacity). `clock` is borrowed (Clock::Real() when null).
  LruEviction(int32_t capacity, const Clock* clock);

  // `id` became evictable: now the most recent. REQUIRES: not contained.
  void Cached(int32_t id);
  // `id` is in use again, or freed. REQUIRES: contained.
  void Uncached(int32_t id);
  // The chunk to evict next; kNone when nothing is cached.
  int32_t Victim() const { return head_; }

  bool contains(int32_t id) const { return links_[id].cached; }
  int32_t size() const { return size_; }
  // How long the victim has been cached; zero when nothing is.
  absl::Duration OldestAge() const;

  // Eviction order, for checks: Victim(), then Next() until kNone.
  int32_t Next(int32_t id) const { return links_[id].next; }
  int32_t Prev(int32_t id) const { return links_[id].prev; }

 private:
  struct Link {
    int32_t prev = kNone;
    int32_t next = kNone;
    bool cached = false;
    absl::Time since;
  };
  const Clock* clock_;
  std::vector<Link> links_;
  int32_t head_ = kNone;  // least recently cached
  int32_t tail_ = kNone;
  int32_t size_ = 0;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_LRU_EVICTION_H_
