// llama.cpp's GBNF grammar syntax, parsed into the grammar IR.
//
//   root  ::= "{" ws pair ("," ws pair)* "}"   # a comment
//   pair  ::= [a-z]+ ":" [0-9]{1,3}
//   ws    ::= [ \t\n]*
//
// Rules are `name ::= alternatives`; names are [A-Za-z0-9_-]+. Terminals are
// "strings" and [classes] ([^...] negated, a-z ranges) with the escapes \n \r
// \t \\ \" \] \- \xHH \uHHHH \UHHHHHHHH (code points, not bytes); `.` is any
// code point. Grouping ( ), alternation |, postfix * + ? {m} {m,} {m,n} {,n}.
// A rule may span lines: it ends where the next `name ::=` begins. The root
// rule is `root`.
//
// Thread ownership: a pure function; safe to call from any thread.
#ifndef CHUNKATTN_TEXT_GRAMMAR_GBNF_H_
#define CHUNKATTN_TEXT_GRAMMAR_GBNF_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "text/grammar/grammar.h"

namespace chunkattn::grammar {

// INVALID_ARGUMENT with the line and column and the reason for a syntax
// error, an undefined or duplicate rule, a missing root, or a bound of
// `limits` exceeded.
absl::StatusOr<Grammar> ParseGbnf(std::string_view text, const Limits& limits = Limits());

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_GBNF_H_
