// A grammar compiled against one vocabulary: the pushdown automaton plus, for
// every automaton state with a byte transition (a *position*), the tokens
// classified once, ahead of decoding (the adaptive token mask idea of
// XGrammar): tokens *accepted* from the position whatever the stack below it,
// tokens *uncertain* (their bytes finish the position's rule and go on, so
// the answer depends on the callers on the stack), the rest rejected. At
// decode time a mask is the union of the accepted sets of the current
// positions plus the uncertain tokens that pass a check against the real
// stack (GrammarMatcher::FillNextTokenBitmask).
//
// A position's classification depends only on the automaton reachable from
// it (its rule's states after it, and its callees) and on the vocabulary. So
// positions are keyed by a canonical description of that reachable part, and
// equal keys share one classification: within a grammar (copies of an
// inlined rule) and across compiles on one vocabulary, through a
// process-wide cache bounded in bytes (the JSON string, number and value
// rules are the same in every schema, and they are the costly positions:
// nearly every token can continue a string). The counted states of
// maxLength, minLength or {m,n} in a rule that calls nothing form chains
// (pda.h): one walk of the vocabulary per chain template gives, per token,
// the interval of counts that accept it (a string of k characters fits
// while k <= maxLength minus the count, closes it once the count plus k
// reaches minLength, ...), so the template's states share classifications
// between the counts where some token's interval ends: at most a few per
// token length, however long the repetition (computed per compile, outside
// the shared cache: one walk per template). Other positions of rules that
// call nothing and agree on every byte string of up to 16 bytes share one
// classification too, exact for tokens of up to 16 bytes and leaving the
// longer ones uncertain.
//
// Thread ownership: immutable after Compile; one instance is shared by every
// request with the same (vocabulary, constraint), on any threads. Compile may
// run on several threads at once (the shared cache is synchronized).
#ifndef CHUNKATTN_TEXT_GRAMMAR_COMPILED_GRAMMAR_H_
#define CHUNKATTN_TEXT_GRAMMAR_COMPILED_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "text/grammar/grammar.h"
#include "text/grammar/json_schema.h"
#include "text/grammar/pda.h"
#include "text/grammar/vocabulary.h"

namespace chunkattn::grammar {

enum class ConstraintKind {
  kJsonSchema,  // text: a JSON Schema
  kJsonObject,  // text: ignored; any JSON object
  kRegex,       // text: a regex the whole output must match
  kChoice,      // text: a JSON array of strings; the output is one of them
  kGrammar,     // text: a GBNF grammar
};

struct Constraint {
  ConstraintKind kind = ConstraintKind::kJsonSchema;
  std::string text;
};

const char* ConstraintKindName(ConstraintKind kind);

// A kChoice constraint of `choices` (its text: their JSON array).
Constraint ChoiceConstraint(const std::vector<std::string>& choices);

// The grammar for `constraint`; INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<Grammar> ConstraintGrammar(const Constraint& constraint, const JsonSchemaOptions& json_options,
                                          const Limits& limits);

class CompiledGrammar {
 public:
  struct Stats {
    int32_t states = 0;           // automaton states
    int32_t positions = 0;        // states with a byte transition
    int32_t distinct_positions = 0;  // distinct classifications used
    int32_t computed_positions = 0;  // of them, computed here (not cached)
    int64_t uncertain_tokens = 0;    // over the distinct positions
    int64_t work = 0;             // trie-node steps while classifying
    double compile_ms = 0;        // automaton + classification
    int64_t memory_bytes = 0;     // approximate heap held
  };

  // `vocab` may be null: the result then matches bytes only (no masks, no
  // AcceptToken). INVALID_ARGUMENT for the automaton's bounds and for
  // classification work over limits.max_compile_work. `use_shared_cache`
  // false computes every classification here (benchmarks, tests).
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
      const Grammar& grammar, std::shared_ptr<const Vocabulary> vocab, const Limits& limits,
      bool use_shared_cache);
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
      const Grammar& grammar, std::shared_ptr<const Vocabulary> vocab, const Limits& limits = Limits()) {
    return Compile(grammar, std::move(vocab), limits, /*use_shared_cache=*/true);
  }

  const Pda& pda() const { return *pda_; }
  const Vocabulary* vocab() const { return vocab_.get(); }
  const Stats& stats() const { return stats_; }

  // Per-position classification (internal to the matcher).
  struct TokenClasses {
    std::vector<int32_t> accepted_ids;    // when small; else accepted_bits
    std::vector<uint32_t> accepted_bits;  // bitmask over token ids
    std::vector<int32_t> uncertain_ranks; // ascending ranks into vocab()->sorted_ids()
  };
  // nullptr for a state without byte transitions.
  const TokenClasses* classes_of(int32_t state) const {
    const int32_t c = class_of_state_[state];
    return c < 0 ? nullptr : classes_[c].get();
  }

 private:
  CompiledGrammar() = default;

  std::shared_ptr<const Pda> pda_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<int32_t> class_of_state_;
  std::vector<std::shared_ptr<const TokenClasses>> classes_;
  Stats stats_;
};

// ConstraintGrammar, then Compile.
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileConstraint(
    const Constraint& constraint, std::shared_ptr<const Vocabulary> vocab,
    const JsonSchemaOptions& json_options = JsonSchemaOptions(), const Limits& limits = Limits());

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_COMPILED_GRAMMAR_H_
