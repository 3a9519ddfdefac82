// UTF-8 checks shared by the tokenizer, the detokenizer and their tests.
// Well-formed means Unicode's Table 3-7: no overlong forms, no surrogates,
// nothing above U+10FFFF. SentencePiece's byte-fallback decoder applies the
// same rules and replaces each byte it cannot use with U+FFFD.
#ifndef CHUNKATTN_TEXT_UTF8_H_
#define CHUNKATTN_TEXT_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace chunkattn {

// Whether `text` is entirely well-formed UTF-8.
bool IsValidUtf8(std::string_view text);

// Length in bytes (0 to 3) of the incomplete character at the end of `bytes`:
// a lead byte followed by fewer continuation bytes than it needs, all still
// within the ranges that can end in a well-formed character (so "\xE2\x82" is
// 2, but "\xE0\x80" is 0: no byte can complete it). 0 when `bytes` ends on a
// complete character or on bytes that can never become one.
size_t IncompleteUtf8SuffixLength(std::string_view bytes);

// `bytes` as well-formed UTF-8: each maximal invalid subsequence becomes one
// U+FFFD (Unicode's "substitution of maximal subparts", which JavaScript's
// TextDecoder and Rust's from_utf8_lossy follow).
std::string ReplaceInvalidUtf8(std::string_view bytes);

// The code point starting at text[i] and its length in bytes.
// REQUIRES: `text` is well-formed UTF-8 and i < text.size() starts a character.
std::pair<char32_t, int> CodePointAt(std::string_view text, size_t i);

// Appends code point `cp` (<= U+10FFFF, not a surrogate) as UTF-8.
void AppendUtf8(char32_t cp, std::string* out);

// Largest n <= min(a.size(), b.size()) with a[0, n) == b[0, n) that does not
// split a character of `b` (b[n] is not a continuation byte).
size_t CommonUtf8PrefixLength(std::string_view a, std::string_view b);

}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_UTF8_H_
