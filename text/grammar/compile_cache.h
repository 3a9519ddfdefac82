// Compiled grammars by (vocabulary, constraint kind, constraint text), least
// recently used first out, bounded in entries and in approximate bytes.
// Failures are cached too, so a hostile constraint sent again costs a lookup.
// Concurrent requests for one key compile it once; the others wait for it.
//
// Thread ownership: safe for concurrent use (one internal mutex, never held
// while compiling). Entries handed out stay valid after eviction (shared).
#ifndef CHUNKATTN_TEXT_GRAMMAR_COMPILE_CACHE_H_
#define CHUNKATTN_TEXT_GRAMMAR_COMPILE_CACHE_H_

#include <cstdint>
#include <future>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "text/grammar/compiled_grammar.h"

namespace chunkattn::grammar {

class CompileCache {
 public:
  struct Options {
    size_t max_entries = 256;
    int64_t max_bytes = int64_t{1} << 30;
    JsonSchemaOptions json_options;
    Limits limits;
  };

  explicit CompileCache(Options options);
  CompileCache(const CompileCache&) = delete;
  CompileCache& operator=(const CompileCache&) = delete;

  // The compiled `constraint` for `vocab` (not null): CompileConstraint's
  // result, cached. Entries are shared only within one `scope` (a tenant),
  // so how fast a compile returns tells no one what another scope compiled.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(std::shared_ptr<const Vocabulary> vocab,
                                                             const Constraint& constraint,
                                                             absl::string_view scope = "");

  size_t size() const;
  int64_t bytes() const;
  int64_t hits() const;
  int64_t misses() const;

 private:
  using Result = absl::StatusOr<std::shared_ptr<const CompiledGrammar>>;
  struct Entry {
    std::string key;
    std::shared_future<Result> result;
    int64_t bytes = 0;  // 0 until compiled
  };

  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // front: most recent
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_COMPILE_CACHE_H_
