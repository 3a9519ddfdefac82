// The time source of the policies (admission stamps, eviction ages), injected
// so that their tests set time by hand instead of sleeping.
#ifndef CHUNKATTN_BASE_CLOCK_H_
#define CHUNKATTN_BASE_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace chunkattn {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The wall clock; process-wide, never destroyed. Thread-safe.
  static const Clock* Real();
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

inline const Clock* Clock::Real() {
  static const Clock* const real = new RealClock();
  return real;
}

// Time that moves only when told to (tests). Not thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override { return now_; }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_CLOCK_H_
