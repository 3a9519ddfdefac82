#include "services/coordinator/text_pool.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <utility>

namespace chunkattn {

TextPool::TextPool(int threads, int max_queued, absl::Duration trim_after)
    : max_queued_(max_queued), trim_after_(trim_after) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back(&TextPool::Run, this);
}

TextPool::~TextPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool TextPool::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stop_ || static_cast<int>(queue_.size()) >= max_queued_) return false;
  queue_.push_back(std::move(task));
  return true;
}

void TextPool::Run() {
  auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !queue_.empty(); };
  while (true) {
    std::function<void()> task;
    bool trim = false;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&ready), trim_after_)) {
        if (queue_.empty()) return;  // stopping, and nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
        ran_since_trim_ = true;
      } else {
        trim = std::exchange(ran_since_trim_, false);
      }
    }
    // Outside the lock: Post must never wait for a trim.
#if defined(__GLIBC__)
    if (trim) malloc_trim(0);
#endif
    if (task) task();
  }
}

}  // namespace chunkattn
