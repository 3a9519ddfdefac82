#include "services/core/lru_eviction.h"

namespace chunkattn {

LruEviction::LruEviction(int32_t capacity, const Clock* clock)
    : clock_(clock != nullptr ? clock : Clock::Real()), links_(static_cast<size_t>(capacity)) {}

void LruEviction::Cached(int32_t id) {
  Link& l = links_[id];
  l.prev = tail_;
  l.next = kNone;
  l.cached = true;
  l.since = clock_->Now();
  if (tail_ != kNone) links_[tail_].next = id; else head_ = id;
  tail_ = id;
  ++size_;
}

void LruEviction::Uncached(int32_t id) {
  Link& l = links_[id];
  if (l.prev != kNone) links_[l.prev].next = l.next; else head_ = l.next;
  if (l.next != kNone) links_[l.next].prev = l.prev; else tail_ = l.prev;
  l = Link{};
  --size_;
}

absl::Duration LruEviction::OldestAge() const {
  if (head_ == kNone) return absl::ZeroDuration();
  return clock_->Now() - links_[head_].since;
}

}  // namespace chunkattn
