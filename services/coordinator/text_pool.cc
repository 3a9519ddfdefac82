#include "services/coordinator/text_pool.h"

#include <utility>

namespace chunkattn {

TextPool::TextPool(int threads, int max_queued) : max_queued_(max_queued) {
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
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace chunkattn
