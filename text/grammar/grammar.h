// The grammar IR every constraint compiles to: named rules whose bodies are
// expression trees over Unicode code points (literals, code point classes,
// sequences, choices, bounded and unbounded repetition, references to rules).
// The GBNF parser, the regex and JSON Schema converters and the choice
// builder produce one; BuildPda (pda.h) turns it into the byte-level pushdown
// automaton the matcher runs.
//
// Text is UTF-8 throughout: a class of code points matches the UTF-8 bytes of
// one code point in it, so every string a grammar accepts is well-formed UTF-8
// (surrogates U+D800..U+DFFF never match).
//
// Thread ownership: a Grammar is a plain value. Building one is single-threaded;
// once built, const methods may be called from any number of threads.
#ifndef CHUNKATTN_TEXT_GRAMMAR_GRAMMAR_H_
#define CHUNKATTN_TEXT_GRAMMAR_GRAMMAR_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace chunkattn::grammar {

// Bounds against hostile constraints. Each one exceeded is INVALID_ARGUMENT
// naming the bound; the defaults admit every realistic tool schema, regex and
// grammar while keeping one compile to well under a second and ~100 MB.
struct Limits {
  int64_t max_input_bytes = 1 << 20;     // schema, regex or grammar text
  int32_t max_nesting_depth = 64;        // JSON nesting, regex groups, GBNF parentheses
  int32_t max_schema_nodes = 20'000;     // subschemas visited while converting a JSON Schema
  int64_t max_exprs = 200'000;           // IR nodes
  int32_t max_rules = 20'000;
  int64_t max_nfa_states = 400'000;      // after expanding {m,n} and inlining
  int64_t max_dfa_states = 100'000;      // per grammar, all rules together
  int32_t max_repeat = 10'000;           // the n of {m,n}
  int64_t max_compile_work = 60'000'000;  // trie-node steps classifying tokens (~1 s)
};

struct CodepointRange {
  uint32_t lo;  // inclusive
  uint32_t hi;  // inclusive
};

class Grammar {
 public:
  using ExprId = int32_t;
  using RuleId = int32_t;
  static constexpr int32_t kUnbounded = -1;

  enum class Kind : uint8_t {
    kEmpty,    // matches ""
    kLiteral,  // `literal`, UTF-8 bytes
    kClass,    // one code point in `ranges`
    kRef,      // rule `rule`
    kSeq,      // `items` in order
    kAlt,      // one of `items`
    kRepeat,   // items[0] repeated [min, max] times; max may be kUnbounded
  };
  struct Expr {
    Kind kind = Kind::kEmpty;
    std::string literal;
    std::vector<CodepointRange> ranges;  // sorted, disjoint, not adjacent
    std::vector<ExprId> items;
    RuleId rule = -1;
    int32_t min = 0;
    int32_t max = 0;
  };
  struct Rule {
    std::string name;
    ExprId body = -1;  // -1 until SetBody
    // Keep this rule a call in the automaton even when it is small and not
    // recursive: the JSON converter shares one string rule among all fields,
    // so its positions are precomputed once (compiled_grammar.h).
    bool no_inline = false;
  };

  // Expressions. Class ranges may be unsorted and overlapping; `negated`
  // complements them within U+0000..U+10FFFF (surrogates never match).
  ExprId Empty();
  ExprId Literal(std::string_view utf8);
  ExprId Class(std::vector<CodepointRange> ranges, bool negated = false);
  ExprId Ref(RuleId rule);
  ExprId Seq(std::vector<ExprId> items);
  ExprId Alt(std::vector<ExprId> items);
  ExprId Repeat(ExprId item, int32_t min, int32_t max);
  ExprId Optional(ExprId item) { return Repeat(item, 0, 1); }
  ExprId Star(ExprId item) { return Repeat(item, 0, kUnbounded); }
  ExprId Plus(ExprId item) { return Repeat(item, 1, kUnbounded); }

  // Rules. Names are unique; AddRule with a taken name appends a suffix.
  RuleId AddRule(std::string_view name);
  void SetBody(RuleId rule, ExprId body) { rules_[rule].body = body; }
  void SetNoInline(RuleId rule) { rules_[rule].no_inline = true; }
  // -1 when absent.
  RuleId FindRule(std::string_view name) const;
  void set_root(RuleId rule) { root_ = rule; }

  RuleId root() const { return root_; }
  const Expr& expr(ExprId id) const { return exprs_[id]; }
  const Rule& rule(RuleId id) const { return rules_[id]; }
  int32_t num_exprs() const { return static_cast<int32_t>(exprs_.size()); }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }

  // OK, or INVALID_ARGUMENT when the root is unset, a rule has no body, a
  // reference is out of range, or a size bound in `limits` is exceeded.
  absl::Status Validate(const Limits& limits) const;

  // GBNF text for the grammar (parseable by ParseGbnf), for errors and tests.
  std::string ToString() const;

 private:
  ExprId Add(Expr e);

  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  RuleId root_ = -1;
};

// Sorted, merged `ranges`; complemented within the Unicode scalar values when
// `negated`.
std::vector<CodepointRange> NormalizeRanges(std::vector<CodepointRange> ranges, bool negated);

// The code point at s[pos] (pos < s.size()) into *cp, and its length in
// bytes; 0 when the bytes there are not one well-formed UTF-8 character.
int DecodeUtf8(std::string_view s, size_t pos, uint32_t* cp);

// The value of hexadecimal digit `c`, or -1 (the parsers' \x and \u escapes).
int HexValue(char c);

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_GRAMMAR_H_
