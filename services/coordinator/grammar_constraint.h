// Structured outputs on the coordinator: a request's compiled constraint
// (text/grammar/) as the scheduler's TokenConstraint, one grammar matcher
// per sample. Masks are computed on the coordinator, not on the workers: the
// mask of step t + 1 needs step t's token, which the coordinator has first,
// and the workers stay free of tokenizers and grammars. They are computed
// after the step's plan has gone out, while the ranks run its forward pass,
// and follow it to rank 0, which needs them only to sample (Scheduler::
// FillMasks, WorkerPool::Step): a mask costs about 1 us at the median and
// under 100 us at p99 on a 150k vocabulary (bench/grammar_bench.cc), about
// 40 us inside a free JSON string. Compiling (the slow part) happens before,
// on the text pool (ProcessInput), cached by (tenant, vocabulary, constraint).
//
// Thread ownership: built on a text-pool thread, then used by the engine
// loop, and by the mask pool for distinct samples at once (each sample has
// its own matcher; the compiled grammar is immutable: TokenConstraint's
// contract).
#ifndef CHUNKATTN_SERVICES_COORDINATOR_GRAMMAR_CONSTRAINT_H_
#define CHUNKATTN_SERVICES_COORDINATOR_GRAMMAR_CONSTRAINT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "services/core/token_constraint.h"
#include "text/grammar/compile_cache.h"
#include "text/grammar/matcher.h"

namespace chunkattn {

// What compiles a request's constraint: the model's vocabulary (its stop
// tokens are the model's EOS tokens) and the shared compile cache.
struct StructuredOutputs {
  std::shared_ptr<const grammar::Vocabulary> vocab;
  grammar::CompileCache* cache = nullptr;  // borrowed; thread-safe
};

// With `complete_within_budget` (a request's complete_within_max_tokens), a
// sample whose budget has just enough tokens left to finish the shortest
// completion of its output is made to write it: from then on its mask holds
// only the next token of that completion (spelled greedily, longest token
// first), then a stop token. Where the vLLM family returns JSON cut off
// at max_tokens, the output then always parses when the budget could hold
// the shortest completion at all. Costs a shortest-completion search per
// step (a walk of the automaton), and the spelling only once the budget is
// within the completion's length in bytes.
class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> grammar, int32_t samples,
                    bool complete_within_budget = false);

  int32_t mask_words() const override { return mask_words_; }
  bool FillNextTokenMask(int32_t sample, int32_t tokens_left, absl::Span<uint32_t> mask) override;
  bool Accept(int32_t sample, int32_t token) override;

  // Sample `sample`'s matcher, for tests and for the fewest tokens left.
  const grammar::GrammarMatcher& matcher(int32_t sample) const { return matchers_[sample]; }

  // The tokens that spell `bytes` from sample `sample`'s state, longest
  // accepted token first (the matcher is left as it was); it stops early
  // where no token fits.
  std::vector<int32_t> Spell(int32_t sample, const std::string& bytes);

 private:
  std::shared_ptr<const grammar::CompiledGrammar> grammar_;
  int32_t mask_words_;
  int32_t vocab_size_;
  bool complete_within_budget_;
  std::vector<grammar::GrammarMatcher> matchers_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_GRAMMAR_CONSTRAINT_H_
