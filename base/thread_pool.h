// A fixed pool of worker threads for data-parallel loops over independent
// work items (the CPU kernels and model, the coordinator's token masks). The
// calling thread takes part, so a pool of N threads starts N - 1 workers.
//
// A decode step is some 60 loops of tens of microseconds each, and waking a
// sleeping thread through a futex costs about as much on a VM, so the worker
// that arrives late leaves the caller doing most items alone (the int8 model
// decoded 1.05x faster on 2 threads than on 1). So the workers, and the caller
// waiting for them, spin for up to kSpin after a loop before they sleep: the
// next loop of the same step starts on threads already awake. An idle pool
// sleeps; a spinning thread yields its CPU every few microseconds, so a
// machine with more threads than cores loses little.
//
// Thread-compatible: one ParallelFor at a time per pool (the owning thread's
// loop); ParallelFor must not be called from inside a work item.
#ifndef CHUNKATTN_BASE_THREAD_POOL_H_
#define CHUNKATTN_BASE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace chunkattn {

// The CPUs this process may use: the hardware threads, bounded by its affinity
// mask and by a cgroup CPU quota (a container's `--cpus` or Kubernetes' CPU
// limit), rounded up. At least 1.
int AvailableCpus();

// Whole CPUs of a cgroup v2 `cpu.max` line ("QUOTA PERIOD", rounded up), or 0
// when it sets no limit ("max ...") or cannot be parsed.
int CpusFromCgroupCpuMax(const std::string& line);

// Boundaries b[0] = 0 < b[1] < ... < b.back() = n of pieces of [0, n) for a
// ParallelFor over `threads` threads that shrink as they go: each piece is
// 1/threads of what is left, rounded up to a multiple of `align`, and at least
// `min_piece` (the last takes the rest). The first `threads` pieces then give
// each thread one long run of consecutive items, which a loop streaming memory
// reads fastest, and the small ones at the end even out a thread that started
// late or ran slower. Empty for n <= 0.
std::vector<int64_t> ShrinkingPieces(int64_t n, int threads, int64_t min_piece, int64_t align);

class ThreadPool {
 public:
  // num_threads <= 0 means AvailableCpus().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // How long a thread spins for the next loop (or the caller for the last
  // worker) before it blocks: kSpinMicros, or CHUNKATTN_POOL_SPIN_US (0 to
  // 10000; 0 never spins, for hosts with more busy threads than cores), read
  // once per process.
  static constexpr int64_t kSpinMicros = 200;
  static int64_t SpinMicros();

  // Calls fn(item, thread) for every item in [0, n) exactly once, with
  // `thread` in [0, num_threads()) naming the thread that runs it (for
  // per-thread scratch), and returns when all have finished. Items are handed
  // out in increasing order, one at a time, to whichever thread is free.
  void ParallelFor(int64_t n, const std::function<void(int64_t item, int thread)>& fn);

 private:
  void WorkerLoop(int thread);
  void RunItems(int thread);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;  // workers wait for a new generation
  std::condition_variable done_cv_;   // the caller waits for busy_ == 0
  // Bumped (release) under mu_ for each loop; read without it by spinners.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> busy_{0};  // workers still in the current loop
  bool stop_ = false;         // guarded by mu_
  // The current loop; written under mu_ before generation_ is bumped.
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_THREAD_POOL_H_
