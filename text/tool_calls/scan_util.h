// Internal to text/tool_calls/: the pieces the streaming parsers share for
// deciding whether buffered text can be passed on yet.
//
// Every decision a parser makes must be prefix-stable: made on a prefix of
// the text with more to come, it is the one it would make on the whole text.
// "Partial" answers (the text ends inside a literal) are how a parser says
// "not decidable yet"; it then waits for more text, or at the end of the
// text takes the partial match as a mismatch.
#ifndef CHUNKATTN_TEXT_TOOL_CALLS_SCAN_UTIL_H_
#define CHUNKATTN_TEXT_TOOL_CALLS_SCAN_UTIL_H_

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string_view>

#include "text/utf8.h"

namespace chunkattn::tools::internal {

enum class Prefix {
  kMatch,     // text[pos, ...) starts with the literal
  kPartial,   // text[pos, end) is a proper prefix of the literal (maybe empty)
  kMismatch,  // no continuation of the text can match
};

// REQUIRES: pos <= text.size().
inline Prefix MatchAt(std::string_view text, size_t pos, std::string_view literal) {
  const std::string_view rest = text.substr(pos);
  if (rest.size() >= literal.size()) {
    return rest.substr(0, literal.size()) == literal ? Prefix::kMatch : Prefix::kMismatch;
  }
  return literal.substr(0, rest.size()) == rest ? Prefix::kPartial : Prefix::kMismatch;
}

// Whether a parser must wait for more text before acting on `m`.
inline bool MustWait(Prefix m, bool at_end) { return m == Prefix::kPartial && !at_end; }

// JSON's whitespace, also what separates blocks.
inline bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline constexpr std::string_view kJsonSpace = " \t\n\r";

inline size_t SkipJsonSpace(std::string_view text, size_t pos) {
  while (pos < text.size() && IsJsonSpace(text[pos])) ++pos;
  return pos;
}

// Bytes at the end of `text` that cannot be passed on yet: the longest
// suffix that is a proper prefix of one of `markers` (it may become the
// marker), or an incomplete UTF-8 character, whichever is longer.
inline size_t UndecidedTailLength(std::string_view text,
                                  std::initializer_list<std::string_view> markers) {
  size_t keep = IncompleteUtf8SuffixLength(text);
  for (std::string_view marker : markers) {
    for (size_t k = std::min(marker.size() - 1, text.size()); k > keep; --k) {
      if (text.substr(text.size() - k) == marker.substr(0, k)) {
        keep = k;
        break;
      }
    }
  }
  return keep;
}

}  // namespace chunkattn::tools::internal

#endif  // CHUNKATTN_TEXT_TOOL_CALLS_SCAN_UTIL_H_
