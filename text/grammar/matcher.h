// Runs one constrained output: accepts bytes or tokens, says whether the
// output may end or go on, rolls back, gives the shortest completion, and
// fills the mask of tokens allowed next.
//
//   auto compiled = CompileConstraint({ConstraintKind::kJsonSchema, schema}, vocab);
//   GrammarMatcher m(*compiled);
//   std::vector<uint32_t> mask(vocab->bitmask_words());
//   while (!m.IsTerminated()) {
//     m.FillNextTokenBitmask(absl::MakeSpan(mask));   // bit i of word i/32: token i allowed
//     int32_t id = Sample(logits, mask);
//     m.AcceptToken(id);
//   }
//
// Thread ownership: a matcher belongs to one request and is used by one
// thread at a time (it is not internally synchronized); it holds a shared
// reference to its CompiledGrammar, which any number of matchers on any
// threads may share. Copying a matcher copies its state (its history and
// stacks), which is as cheap as the output so far is short.
#ifndef CHUNKATTN_TEXT_GRAMMAR_MATCHER_H_
#define CHUNKATTN_TEXT_GRAMMAR_MATCHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "text/grammar/compiled_grammar.h"
#include "text/grammar/stack_machine.h"

namespace chunkattn::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Appends `bytes` if the output stays a prefix of some match; false (and
  // no change) otherwise. One step for Rollback.
  bool AcceptBytes(std::string_view bytes);
  // Appends a token's bytes (one step). A stop token is accepted exactly
  // when IsCompleted(), and terminates the matcher; control tokens never.
  // REQUIRES: compiled with a vocabulary; 0 <= token_id < vocab_size.
  bool AcceptToken(int32_t token_id);
  // Undoes the last `num_steps` accepted steps (all of them if more).
  void Rollback(int32_t num_steps);
  int32_t num_steps() const { return static_cast<int32_t>(history_.size()) - 1; }

  // The output so far is a complete match (a stop token may come next).
  bool IsCompleted() const { return history_.back().completed && !history_.back().terminated; }
  // Some byte may follow.
  bool CanContinue() const { return Size() > 0 && !history_.back().terminated; }
  // A stop token was accepted.
  bool IsTerminated() const { return history_.back().terminated; }
  // RESOURCE_EXHAUSTED once a step failed because an ambiguous grammar grew
  // the parse past StackMachine::kMaxElements stacks; OK otherwise.
  absl::Status status() const;

  // The fewest bytes that make the output a complete match ("" when it
  // already is). Later steps may rely on it: AcceptBytes(ShortestCompletion())
  // succeeds and leaves IsCompleted() true.
  std::string ShortestCompletion() const;

  // Sets bit i (word i / 32, bit i % 32) of `bitmask` exactly when token i
  // may come next; other bits are cleared. Stop tokens are set exactly when
  // IsCompleted(). INVALID_ARGUMENT when `bitmask` has fewer than
  // vocab()->bitmask_words() words or there is no vocabulary.
  absl::Status FillNextTokenBitmask(absl::Span<uint32_t> bitmask);

  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  struct Checkpoint {
    size_t begin;        // elements in sets_[begin, end)
    size_t end;
    size_t num_frames;   // machine frames in use at this step
    bool completed;
    bool terminated;
  };

  size_t Size() const { return history_.back().end - history_.back().begin; }
  // Steps `bytes` from the current set; on success appends a checkpoint.
  bool Advance(std::string_view bytes);
  // Whether `bytes` may follow; uses walk_ as scratch with prefix sharing.
  void CheckUncertain(const std::vector<int32_t>& ranks, absl::Span<uint32_t> bitmask);

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackMachine machine_;
  std::vector<uint64_t> sets_;  // every checkpoint's elements, in order
  std::vector<Checkpoint> history_;
  std::vector<uint64_t> scratch_;
  // FillNextTokenBitmask's scratch.
  std::vector<uint64_t> walk_;
  std::vector<size_t> walk_begin_, walk_end_, walk_frames_;
  std::vector<uint8_t> walk_completed_;
  std::vector<int32_t> merged_;
};

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_MATCHER_H_
