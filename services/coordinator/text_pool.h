// Threads that tokenize prompts (and run anything else proportional to a
// request's text) off gRPC's callback threads: a long prompt must never stall
// the reactor that streams every other request's tokens. The queue is
// bounded, so a flood of text is refused instead of buffered.
//
// Thread-safe: Post may be called from any thread; tasks run on the pool's
// threads in no particular order. The destructor runs what is queued, then
// joins.
//
// Tokenizing a prompt at the byte bound allocates ~100 bytes per byte, and
// glibc keeps what each thread's arena freed: a few such prompts left the
// coordinator ~30 MiB larger for good. So once the pool has been idle for
// `trim_after` after running anything, one thread hands the freed pages back
// (malloc_trim): free under load, and an idle coordinator returns to its size.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_TEXT_POOL_H_
#define CHUNKATTN_SERVICES_COORDINATOR_TEXT_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chunkattn {

// Texts waiting for the coordinator's pool beyond which new ones are refused
// (every front's).
inline constexpr int kMaxQueuedTexts = 4096;

class TextPool {
 public:
  TextPool(int threads, int max_queued, absl::Duration trim_after = absl::Seconds(1));
  ~TextPool();
  TextPool(const TextPool&) = delete;
  TextPool& operator=(const TextPool&) = delete;

  // False (and `task` is dropped, not run) when max_queued tasks wait.
  bool Post(std::function<void()> task);

 private:
  void Run();

  const int max_queued_;
  const absl::Duration trim_after_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool ran_since_trim_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_TEXT_POOL_H_
