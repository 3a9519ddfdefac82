#include "base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace chunkattn {

int CpusFromCgroupCpuMax(const std::string& line) {
  std::istringstream in(line);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || period <= 0 || quota == "max") return 0;
  long long q = 0;
  try {
    size_t used = 0;
    q = std::stoll(quota, &used);
    if (used != quota.size()) return 0;
  } catch (...) {
    return 0;
  }
  if (q <= 0) return 0;
  return static_cast<int>((q + period - 1) / period);
}

int AvailableCpus() {
  int n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = std::min(n, std::max(1, CPU_COUNT(&set)));
  // cgroup v2 (the process's own cgroup is the namespace root in a container).
  std::ifstream cpu_max("/sys/fs/cgroup/cpu.max");
  std::string line;
  if (cpu_max && std::getline(cpu_max, line)) {
    if (int quota = CpusFromCgroupCpuMax(line); quota > 0) n = std::min(n, quota);
  } else {
    // cgroup v1: cfs_quota_us is -1 without a limit.
    std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    long long quota = -1, period = 0;
    if (q >> quota && p >> period && quota > 0 && period > 0) {
      n = std::min(n, static_cast<int>((quota + period - 1) / period));
    }
  }
  return std::max(1, n);
}

std::vector<int64_t> ShrinkingPieces(int64_t n, int threads, int64_t min_piece, int64_t align) {
  std::vector<int64_t> bounds;
  if (n <= 0) return bounds;
  threads = std::max(1, threads);
  align = std::max<int64_t>(1, align);
  min_piece = std::max<int64_t>(1, min_piece);
  bounds.push_back(0);
  for (int64_t j = 0; j < n;) {
    int64_t piece = std::max(min_piece, (n - j) / threads);
    piece = (piece + align - 1) / align * align;
    j = n - j <= piece ? n : j + piece;
    bounds.push_back(j);
  }
  return bounds;
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = AvailableCpus();
  workers_.reserve(num_threads - 1);
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunItems(int thread) {
  for (int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    (*fn_)(i, thread);
  }
}

int64_t ThreadPool::SpinMicros() {
  static const int64_t micros = [] {
    const char* env = std::getenv("CHUNKATTN_POOL_SPIN_US");
    if (env == nullptr || *env == '\0') return kSpinMicros;
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    return *end == '\0' && v >= 0 && v <= 10000 ? static_cast<int64_t>(v) : kSpinMicros;
  }();
  return micros;
}

namespace {

// Spins until done() or SpinMicros() pass; true if done() came true.
template <class Done>
bool SpinUntil(const Done& done) {
  const int64_t micros = ThreadPool::SpinMicros();
  if (micros == 0) return done();
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (int i = 1;; ++i) {
    if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= end) return done();
      std::this_thread::yield();
    }
  }
}

}  // namespace

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  while (true) {
    if (!SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    seen = generation_.load(std::memory_order_acquire);
    RunItems(thread);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under mu_, so a caller between its check and its wait cannot miss it.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();  // no system call when every worker is spinning
  RunItems(0);
  if (!SpinUntil([&] { return busy_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return busy_.load(std::memory_order_acquire) == 0; });
  }
  std::lock_guard<std::mutex> lock(mu_);
  fn_ = nullptr;
}

}  // namespace chunkattn
