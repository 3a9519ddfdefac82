// The byte-level pushdown automaton a grammar compiles to: one deterministic
// automaton per rule over bytes, whose states may also *call* another rule
// (push a return state, run the callee from its start, pop back when the
// callee reaches a final state). Recursion is a stack, never an unrolling.
//
// Small rules that are not recursive are inlined into their callers (so a
// `char*` loop becomes a loop inside one rule, and a state inside it knows
// what follows); rules marked no_inline, recursive rules and the root stay
// calls. Each rule's automaton is determinized over byte equivalence classes,
// trimmed to the states from which the rule can finish, and minimized (states
// of a rule that behave alike merged; skipped when that would take too long).
//
// Counted repetition x{m,n} (maxLength, minLength, a regex's {m,n}) expands
// to one copy of x's states per count. Within rules that call nothing, those
// copies are grouped into *chain templates*: the states of a template behave
// alike but for their count k (copies of x done), so that one classification
// of the vocabulary per template serves every count (compiled_grammar.h).
// The grouping comes from the expansion and is then checked on the finished
// automaton; a repetition that fails the check is left ungrouped.
//
// Refused with INVALID_ARGUMENT and the reason: left recursion (a rule that
// can reach itself without consuming a byte: the stack would grow forever),
// a grammar that matches no string, and automata larger than the limits.
//
// Thread ownership: immutable after Build; safe to share between threads.
#ifndef CHUNKATTN_TEXT_GRAMMAR_PDA_H_
#define CHUNKATTN_TEXT_GRAMMAR_PDA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "text/grammar/grammar.h"

namespace chunkattn::grammar {

class Pda {
 public:
  struct Call {
    int32_t rule;  // callee
    int32_t ret;   // state of the caller's rule to continue at after the callee
  };

  static absl::StatusOr<std::shared_ptr<const Pda>> Build(const Grammar& grammar, const Limits& limits);

  int32_t num_states() const { return static_cast<int32_t>(final_.size()); }
  int32_t num_rules() const { return static_cast<int32_t>(rule_start_.size()); }
  int32_t num_byte_classes() const { return num_classes_; }
  int32_t root_rule() const { return root_; }
  int32_t rule_start(int32_t rule) const { return rule_start_[rule]; }
  int32_t rule_of(int32_t state) const { return rule_of_[state]; }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  bool is_final(int32_t state) const { return final_[state] != 0; }
  // Whether `state` has at least one byte transition.
  bool has_bytes(int32_t state) const { return has_bytes_[state] != 0; }
  uint8_t byte_class(uint8_t byte) const { return byte_class_[byte]; }
  // Next state on `byte`, or -1.
  int32_t Next(int32_t state, uint8_t byte) const {
    return next_[static_cast<size_t>(state) * num_classes_ + byte_class_[byte]];
  }
  int32_t NextByClass(int32_t state, int32_t cls) const {
    return next_[static_cast<size_t>(state) * num_classes_ + cls];
  }
  absl::Span<const Call> calls(int32_t state) const {
    return absl::MakeConstSpan(calls_.data() + call_begin_[state], call_begin_[state + 1] - call_begin_[state]);
  }

  // Fewest bytes that finish the rule of `state` from it (callees included).
  int32_t min_bytes(int32_t state) const { return min_bytes_[state]; }
  // Appends the bytes of one shortest way to finish the rule of `state`.
  void AppendShortestFinish(int32_t state, std::string* out) const;

  // Total transitions (bytes and calls), for limits and reports.
  int64_t num_transitions() const { return num_transitions_; }

  // Chain templates (see above). A byte class moves every state of a
  // template the same way: to one template with the count k + delta (capped
  // at the template's cap: x{m,} counts past m as m), or out of the chain to
  // one state, exactly when k lies in [lo, hi]; elsewhere it has no move. A
  // state of the template is final exactly when k lies in [final_lo,
  // final_hi]. Chain states have no calls.
  struct ChainMove {
    int32_t to = -1;  // a template, or a state when `exit`; -1: no move at any count
    bool exit = false;
    int32_t delta = 0;
    int32_t lo = 0;
    int32_t hi = -1;
  };
  struct ChainTemplate {
    int32_t cap = 0;
    int32_t final_lo = 0;
    int32_t final_hi = -1;
    std::vector<ChainMove> moves;  // per byte class
  };
  int32_t num_chain_templates() const { return static_cast<int32_t>(chains_.size()); }
  const ChainTemplate& chain(int32_t t) const { return chains_[t]; }
  // The template of `state`, or -1 when it is in none; and its count.
  int32_t chain_of(int32_t state) const { return chain_of_[state]; }
  int32_t chain_count(int32_t state) const { return chain_count_[state]; }

 private:
  Pda() = default;
  friend class PdaBuilder;

  int32_t num_classes_ = 0;
  int32_t root_ = 0;
  uint8_t byte_class_[256] = {};
  std::vector<int32_t> next_;  // [state * num_classes_ + class]
  std::vector<uint8_t> final_;
  std::vector<uint8_t> has_bytes_;
  std::vector<int32_t> call_begin_;  // num_states + 1
  std::vector<Call> calls_;
  std::vector<int32_t> rule_start_;
  std::vector<int32_t> rule_of_;
  std::vector<std::string> rule_names_;
  std::vector<int32_t> min_bytes_;
  // The move that achieves min_bytes_: a byte (>= 0), a call index
  // (-2 - index into calls_), or -1 at a final state with nothing left.
  std::vector<int32_t> best_move_;
  int64_t num_transitions_ = 0;
  std::vector<int32_t> chain_of_;
  std::vector<int32_t> chain_count_;
  std::vector<ChainTemplate> chains_;
};

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_PDA_H_
