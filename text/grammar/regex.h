// Regular expressions as grammar expressions: the subset that JSON Schema's
// `pattern` and vLLM's `regex` use, with PCRE2's default meanings (ASCII \d
// \w \s; `.` is any code point but \n).
//
// Supported: literals and escapes (\n \r \t \f \v \0 \xHH \x{H..} \uHHHH \u{H..}
// \\ and any escaped punctuation), classes [a-z] [^...] with \d \w \s \D \W
// \S inside or outside, `.`, alternation, groups ( ) (?: ) (?<name> )
// (?P<name> ), quantifiers * + ? {m} {m,} {m,n} and their lazy forms (the
// same language), anchors ^ and $ at the start and end of a top-level
// alternative. Anything else (backreferences, lookaround, \b, inline flags,
// possessive quantifiers, anchors elsewhere) is INVALID_ARGUMENT naming it.
//
// Thread ownership: pure functions; safe to call from any thread.
#ifndef CHUNKATTN_TEXT_GRAMMAR_REGEX_H_
#define CHUNKATTN_TEXT_GRAMMAR_REGEX_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "text/grammar/grammar.h"

namespace chunkattn::grammar {

struct RegexOptions {
  // Whole-string match (vLLM's `regex`): anchors are implied. When false
  // (JSON Schema's `pattern`), an alternative without ^ may be preceded, and
  // one without $ followed, by any text.
  bool full_match = true;
  // Match the regex against a JSON string's value, emitting the JSON-escaped
  // spelling: '"' and '\' as \" and \\, control characters as \n, \t, ... or
  // \u00XX. The expression then matches the text between the quotes.
  bool json_string = false;
};

// An expression in `g` for `pattern`. INVALID_ARGUMENT with the offset and
// the reason for unsupported or malformed syntax or a bound of `limits`.
absl::StatusOr<Grammar::ExprId> AddRegex(Grammar* g, std::string_view pattern,
                                         const RegexOptions& options, const Limits& limits);

// A grammar whose root matches exactly the strings `pattern` fully matches.
absl::StatusOr<Grammar> RegexToGrammar(std::string_view pattern, const Limits& limits = Limits());

// The JSON-escaped spellings of one code point class (see json_string above).
Grammar::ExprId JsonStringClass(Grammar* g, const std::vector<CodepointRange>& ranges);

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_REGEX_H_
