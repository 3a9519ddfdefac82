// The scheduler's two choices about requests, each a small class with one
// call, unit-tested on its own (services/tests/policies_test.cc):
//  - AdmissionPolicy: in which order waiting requests are admitted;
//  - PreemptionPolicy: which running request gives way when a decode step
//    finds no chunk.
// (The third choice, which cached chunk to evict, is the forest's:
// services/core/lru_eviction.h.)
//
// Priorities follow vLLM's convention: a lower value is served first, 0 is
// the default. Arrival times come from the scheduler's injected clock.
//
// Thread-compatible: immutable after construction.
#ifndef CHUNKATTN_SERVICES_CORE_POLICIES_H_
#define CHUNKATTN_SERVICES_CORE_POLICIES_H_

#include <cstdint>
#include <tuple>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace chunkattn {

// The bounds of a request's priority (the API front checks them).
inline constexpr int32_t kMinPriority = -1000000;
inline constexpr int32_t kMaxPriority = 1000000;

// What the policies know of a request.
struct QueuedRequest {
  int32_t priority = 0;
  absl::Time arrival;
  int64_t sequence = 0;  // arrival order, unique: breaks every tie
};

// A request's place in the admission order; smaller goes first.
struct AdmissionKey {
  int64_t major = 0;
  int64_t minor = 0;
  int64_t sequence = 0;
  bool operator<(const AdmissionKey& o) const {
    return std::tie(major, minor, sequence) < std::tie(o.major, o.minor, o.sequence);
  }
  bool operator==(const AdmissionKey& o) const {
    return major == o.major && minor == o.minor && sequence == o.sequence;
  }
};

class AdmissionPolicy {
 public:
  // aging zero: strict priority, FCFS within one (vLLM's priority policy).
  // aging > 0: a waiting request gains one priority level per `aging`
  // waited, so a steady stream of urgent requests cannot starve the others.
  // That is ordering by arrival + priority * aging, a key that does not
  // change while the request waits, so the queue never needs re-sorting.
  // REQUIRES: 0 <= aging <= kMaxAging.
  explicit AdmissionPolicy(absl::Duration aging = absl::ZeroDuration()) : aging_(aging) {}
  static constexpr absl::Duration kMaxAging = absl::Hours(24);

  AdmissionKey Key(const QueuedRequest& r) const;

 private:
  absl::Duration aging_;
};

class PreemptionPolicy {
 public:
  // `order` is borrowed.
  explicit PreemptionPolicy(const AdmissionPolicy* order) : order_(order) {}

  // The index in `running` of the request to preempt: the one admission
  // would take last (lowest priority, then newest), so what was admitted
  // first is preempted last. -1 when `running` is empty.
  int Victim(absl::Span<const QueuedRequest> running) const;

 private:
  const AdmissionPolicy* order_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_POLICIES_H_
