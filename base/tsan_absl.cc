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

void PreLock(bool on, void* mu, unsigned flags) {
  if (on) __tsan_mutex_pre_lock(mu, flags);
}
void PostLock(bool on, void* mu, unsigned flags) {
  if (on) __tsan_mutex_post_lock(mu, flags, 0);
}
void PreUnlock(bool on, void* mu, unsigned flags) {
  if (on) __tsan_mutex_pre_unlock(mu, flags);
}
void PostUnlock(bool on, void* mu, unsigned flags) {
  if (on) __tsan_mutex_post_unlock(mu, flags);
}
// A wait that gives the lock up and takes it back (Await, CondVar::Wait):
// a release before, an acquire after.
void Release(bool on, void* mu, unsigned flags) {
  PreUnlock(on, mu, flags);
  PostUnlock(on, mu, flags);
}

}  // namespace

#define CHUNKATTN_REAL(type, mangled) static const auto real = Real<type>(mangled)

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  CHUNKATTN_REAL(void (*)(Mutex*), "_ZN4absl7debian35MutexD1Ev");
  const bool on = Annotating(__builtin_return_address(0));
  if (on) __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  CHUNKATTN_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  const bool on = Annotating(__builtin_return_address(0));
  PreLock(on, this, 0);
  real(this);
  PostLock(on, this, 0);
}

void Mutex::ReaderLock() {
  CHUNKATTN_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  const bool on = Annotating(__builtin_return_address(0));
  PreLock(on, this, kReadLock);
  real(this);
  PostLock(on, this, kReadLock);
}

bool Mutex::TryLock() {
  CHUNKATTN_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool on = Annotating(__builtin_return_address(0));
  PreLock(on, this, kTryLock);
  const bool ok = real(this);
  PostLock(on, this, kTryLock | (ok ? 0 : kTryLockFailed));
  return ok;
}

bool Mutex::ReaderTryLock() {
  CHUNKATTN_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool on = Annotating(__builtin_return_address(0));
  PreLock(on, this, kReadLock | kTryLock);
  const bool ok = real(this);
  PostLock(on, this, kReadLock | kTryLock | (ok ? 0 : kTryLockFailed));
  return ok;
}

void Mutex::Unlock() {
  CHUNKATTN_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  const bool on = Annotating(__builtin_return_address(0));
  PreUnlock(on, this, 0);
  real(this);
  PostUnlock(on, this, 0);
}

void Mutex::ReaderUnlock() {
  CHUNKATTN_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  const bool on = Annotating(__builtin_return_address(0));
  PreUnlock(on, this, kReadLock);
  real(this);
  PostUnlock(on, this, kReadLock);
}

void Mutex::LockWhen(const Condition& cond) {
  CHUNKATTN_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  const bool on = Annotating(__builtin_return_address(0));
  PreLock(on, this, 0);
  real(this, cond);
  PostLock(on, this, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  CHUNKATTN_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  const bool on = Annotating(__builtin_return_address(0));
  PreLock(on, this, kReadLock);
  real(this, cond);
  PostLock(on, this, kReadLock);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  CHUNKATTN_REAL(bool (*)(Mutex*, const Condition&, Duration),
                 "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool on = Annotating(__builtin_return_address(0));
  PreLock(on, this, 0);
  const bool met = real(this, cond, timeout);
  PostLock(on, this, 0);  // held either way
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  CHUNKATTN_REAL(bool (*)(Mutex*, const Condition&, Time),
                 "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool on = Annotating(__builtin_return_address(0));
  PreLock(on, this, 0);
  const bool met = real(this, cond, deadline);
  PostLock(on, this, 0);
  return met;
}

void Mutex::Await(const Condition& cond) {
  CHUNKATTN_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  const bool on = Annotating(__builtin_return_address(0));
  Release(on, this, 0);
  PreLock(on, this, 0);
  real(this, cond);
  PostLock(on, this, 0);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  CHUNKATTN_REAL(bool (*)(Mutex*, const Condition&, Duration),
                 "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool on = Annotating(__builtin_return_address(0));
  Release(on, this, 0);
  PreLock(on, this, 0);
  const bool met = real(this, cond, timeout);
  PostLock(on, this, 0);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  CHUNKATTN_REAL(bool (*)(Mutex*, const Condition&, Time),
                 "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool on = Annotating(__builtin_return_address(0));
  Release(on, this, 0);
  PreLock(on, this, 0);
  const bool met = real(this, cond, deadline);
  PostLock(on, this, 0);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  CHUNKATTN_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  const bool on = Annotating(__builtin_return_address(0));
  Release(on, mu, 0);
  PreLock(on, mu, 0);
  real(this, mu);
  PostLock(on, mu, 0);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  CHUNKATTN_REAL(bool (*)(CondVar*, Mutex*, Duration),
                 "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  const bool on = Annotating(__builtin_return_address(0));
  Release(on, mu, 0);
  PreLock(on, mu, 0);
  const bool timed_out = real(this, mu, timeout);
  PostLock(on, mu, 0);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  CHUNKATTN_REAL(bool (*)(CondVar*, Mutex*, Time),
                 "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  const bool on = Annotating(__builtin_return_address(0));
  Release(on, mu, 0);
  PreLock(on, mu, 0);
  const bool timed_out = real(this, mu, deadline);
  PostLock(on, mu, 0);
  return timed_out;
}

// Notify releases on the object; every wait (and the inline
// HasBeenNotified's acquire load of the flag) acquires from it.
void Notification::Notify() {
  CHUNKATTN_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  const bool on = Annotating(__builtin_return_address(0));
  if (on) {
    __tsan_release(this);
    __tsan_release(const_cast<std::atomic<bool>*>(&notified_yet_));
  }
  real(this);
}

void Notification::WaitForNotification() const {
  CHUNKATTN_REAL(void (*)(const Notification*), "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  const bool on = Annotating(__builtin_return_address(0));
  real(this);
  if (on) __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  CHUNKATTN_REAL(bool (*)(const Notification*, Duration),
                 "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool on = Annotating(__builtin_return_address(0));
  const bool notified = real(this, timeout);
  if (notified && on) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  CHUNKATTN_REAL(bool (*)(const Notification*, Time),
                 "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool on = Annotating(__builtin_return_address(0));
  const bool notified = real(this, deadline);
  if (notified && on) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
