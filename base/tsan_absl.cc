// Preloaded (LD_PRELOAD) into the thread-sanitizer build's processes so that
// ThreadSanitizer sees absl::Mutex, CondVar and Notification.
//
// Why: Debian's Abseil is not built with -fsanitize=thread, so its Mutex
// (lock-free fast path, futex slow path) synchronizes invisibly and every
// access guarded by one would be reported as a race. This library defines
// the same member functions, tells TSan what each does through its public
// annotation interface, and forwards to the real one (dlsym RTLD_NEXT).
//
// Only calls from the executable (our instrumented code: our libraries are
// static) are annotated. gRPC's own locks are absl::Mutex too, but gRPC
// also locks and waits through paths this file does not see, so annotating
// them gave TSan an inconsistent picture ("unlock of an unlocked mutex");
// gRPC stays as opaque to TSan as any uninstrumented library.
//
// In a process without the TSan runtime (python3 starting a server) the
// annotations are weak nulls and the calls just forward.
#include <dlfcn.h>
#include <link.h>

#include <cstdint>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" {
void __tsan_acquire(void* addr) __attribute__((weak));
void __tsan_release(void* addr) __attribute__((weak));
void __tsan_mutex_pre_lock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_post_lock(void* addr, unsigned flags, int recursion) __attribute__((weak));
int __tsan_mutex_pre_unlock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_post_unlock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_destroy(void* addr, unsigned flags) __attribute__((weak));
}

namespace {

// Flags of tsan_interface.h.
constexpr unsigned kReadLock = 1 << 3;
constexpr unsigned kTryLock = 1 << 4;
constexpr unsigned kTryLockFailed = 1 << 5;

template <typename Fn>
Fn Real(const char* mangled) {
  void* fn = dlsym(RTLD_NEXT, mangled);
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl: %s not found after the preload\n", mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// The executable's mapped range, from the first object dl_iterate_phdr
// reports (the program itself).
struct Range {
  uintptr_t begin = 0, end = 0;
};

Range ExecutableRange() {
  Range r;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* range = static_cast<Range*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const uintptr_t b = info->dlpi_addr + ph.p_vaddr, e = b + ph.p_memsz;
          if (range->begin == 0 || b < range->begin) range->begin = b;
          if (e > range->end) range->end = e;
        }
        return 1;  // the first object only
      },
      &r);
  return r;
}

// Whether the call being forwarded comes from instrumented code and TSan is
// there to be told.
bool Annotating(const void* caller) {
  if (__tsan_mutex_pre_lock == nullptr) return false;
  static const Range exe = ExecutableRange();
  const auto pc = reinterpret_cast<uintptr_t>(caller);
  return pc >= exe.begin && pc < exe.end;
}

// Tells TSan about one call that takes `mu`: before it, and when it has
// returned (the destructor runs after the return value is computed).
class Acquiring {
 public:
  Acquiring(bool on, void* mu, unsigned flags) : on_(on), mu_(mu), flags_(flags) {
    if (on_) __tsan_mutex_pre_lock(mu_, flags_);
  }
  ~Acquiring() {
    if (on_) __tsan_mutex_post_lock(mu_, flags_, 0);
  }
  // For a try-lock: whether it took the lock.
  void set_failed(bool failed) {
    if (failed) flags_ |= kTryLockFailed;
  }

 private:
  const bool on_;
  void* const mu_;
  unsigned flags_;
};

// Likewise for a call that gives `mu` up.
class Releasing {
 public:
  Releasing(bool on, void* mu, unsigned flags) : on_(on), mu_(mu), flags_(flags) {
    if (on_) __tsan_mutex_pre_unlock(mu_, flags_);
  }
  ~Releasing() {
    if (on_) __tsan_mutex_post_unlock(mu_, flags_);
  }

 private:
  const bool on_;
  void* const mu_;
  const unsigned flags_;
};

// A wait gives the lock up and takes it back (Await, CondVar::Wait): to TSan
// a release now, then an acquire around the real call (an Acquiring).
void Release(bool on, void* mu) {
  Releasing released(on, mu, 0);  // both halves at once
}

}  // namespace

// In each function below: `real`, the function this one stands in for, and
// `on`, whether to tell TSan (read from this function's own return address).
#define CHUNKATTN_FORWARD(type, mangled)      \
  static const auto real = Real<type>(mangled); \
  const bool on = Annotating(__builtin_return_address(0))

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  CHUNKATTN_FORWARD(void (*)(Mutex*), "_ZN4absl7debian35MutexD1Ev");
  if (on) __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  CHUNKATTN_FORWARD(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  Acquiring lock(on, this, 0);
  real(this);
}

void Mutex::ReaderLock() {
  CHUNKATTN_FORWARD(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  Acquiring lock(on, this, kReadLock);
  real(this);
}

bool Mutex::TryLock() {
  CHUNKATTN_FORWARD(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  Acquiring lock(on, this, kTryLock);
  const bool ok = real(this);
  lock.set_failed(!ok);
  return ok;
}

bool Mutex::ReaderTryLock() {
  CHUNKATTN_FORWARD(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  Acquiring lock(on, this, kReadLock | kTryLock);
  const bool ok = real(this);
  lock.set_failed(!ok);
  return ok;
}

void Mutex::Unlock() {
  CHUNKATTN_FORWARD(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Releasing unlock(on, this, 0);
  real(this);
}

void Mutex::ReaderUnlock() {
  CHUNKATTN_FORWARD(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Releasing unlock(on, this, kReadLock);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  CHUNKATTN_FORWARD(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Acquiring lock(on, this, 0);
  real(this, cond);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  CHUNKATTN_FORWARD(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Acquiring lock(on, this, kReadLock);
  real(this, cond);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  CHUNKATTN_FORWARD(bool (*)(Mutex*, const Condition&, Duration),
                    "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Acquiring lock(on, this, 0);  // held either way
  return real(this, cond, timeout);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  CHUNKATTN_FORWARD(bool (*)(Mutex*, const Condition&, Time),
                    "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Acquiring lock(on, this, 0);
  return real(this, cond, deadline);
}

void Mutex::Await(const Condition& cond) {
  CHUNKATTN_FORWARD(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Release(on, this);
  Acquiring lock(on, this, 0);
  real(this, cond);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  CHUNKATTN_FORWARD(bool (*)(Mutex*, const Condition&, Duration),
                    "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(on, this);
  Acquiring lock(on, this, 0);
  return real(this, cond, timeout);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  CHUNKATTN_FORWARD(bool (*)(Mutex*, const Condition&, Time),
                    "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(on, this);
  Acquiring lock(on, this, 0);
  return real(this, cond, deadline);
}

void CondVar::Wait(Mutex* mu) {
  CHUNKATTN_FORWARD(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(on, mu);
  Acquiring lock(on, mu, 0);
  real(this, mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  CHUNKATTN_FORWARD(bool (*)(CondVar*, Mutex*, Duration),
                    "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(on, mu);
  Acquiring lock(on, mu, 0);
  return real(this, mu, timeout);
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  CHUNKATTN_FORWARD(bool (*)(CondVar*, Mutex*, Time),
                    "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(on, mu);
  Acquiring lock(on, mu, 0);
  return real(this, mu, deadline);
}

// Notify releases on the object; every wait (and the inline
// HasBeenNotified's acquire load of the flag) acquires from it.
void Notification::Notify() {
  CHUNKATTN_FORWARD(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  if (on) {
    __tsan_release(this);
    __tsan_release(const_cast<std::atomic<bool>*>(&notified_yet_));
  }
  real(this);
}

void Notification::WaitForNotification() const {
  CHUNKATTN_FORWARD(void (*)(const Notification*), "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  if (on) __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  CHUNKATTN_FORWARD(bool (*)(const Notification*, Duration),
                    "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified && on) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  CHUNKATTN_FORWARD(bool (*)(const Notification*, Time),
                    "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified && on) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
