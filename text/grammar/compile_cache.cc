#include "text/grammar/compile_cache.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace chunkattn::grammar {

CompileCache::CompileCache(Options options) : options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileCache::Get(std::shared_ptr<const Vocabulary> vocab,
                                                                         const Constraint& constraint,
                                                                         absl::string_view scope) {
  if (vocab == nullptr) return absl::InvalidArgumentError("CompileCache::Get: no vocabulary");
  // The scope's length and bytes, the vocabulary's content hash and size,
  // the kind, then the text: no part can alias another.
  std::string key = absl::StrCat(scope.size(), ":", scope, ":", vocab->fingerprint(), ":", vocab->vocab_size(), ":",
                                 static_cast<int>(constraint.kind), ":", constraint.text);
  std::promise<Result> promise;
  std::shared_future<Result> future;
  bool owner = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second);
      future = it->second->result;
    } else {
      ++misses_;
      owner = true;
      future = promise.get_future().share();
      lru_.push_front(Entry{key, future, 0});
      index_[key] = lru_.begin();
      EvictLocked();
    }
  }
  if (!owner) return future.get();  // compiled, or being compiled by another thread
  Result result = CompileConstraint(constraint, std::move(vocab), options_.json_options, options_.limits);
  // What its tables hold, and its key twice (the list's and the index's):
  // a long constraint text costs what it takes, failed or not.
  const int64_t cost = (result.ok() ? (*result)->stats().memory_bytes : 0) + 2 * static_cast<int64_t>(key.size());
  promise.set_value(result);
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it != index_.end() && it->second->bytes == 0) {
    it->second->bytes = cost;
    bytes_ += cost;
    EvictLocked();
  }
  return result;
}

void CompileCache::EvictLocked() {
  while (lru_.size() > options_.max_entries || (bytes_ > options_.max_bytes && lru_.size() > 1)) {
    Entry& victim = lru_.back();
    bytes_ -= victim.bytes;
    index_.erase(victim.key);
    lru_.pop_back();
  }
}

size_t CompileCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

int64_t CompileCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t CompileCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t CompileCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

}  // namespace chunkattn::grammar
