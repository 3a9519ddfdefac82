// Python's str as the engine needs it: strings are UTF-8 but index, count,
// strip, split and change case by code point, with Python's notion of
// whitespace, letters and digits. Shared by the lexer, the interpreter, the str
// methods and the filters.
#ifndef CHUNKATTN_TEXT_JINJA_PY_STR_H_
#define CHUNKATTN_TEXT_JINJA_PY_STR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/value.h"

namespace chunkattn {
namespace jinja {

std::vector<char32_t> CodePoints(std::string_view s);
std::string FromCodePoints(const char32_t* begin, const char32_t* end);
size_t CodePointCount(std::string_view s);

// str.isspace(): bidirectional class WS, B or S, or category Zs.
bool IsPySpace(char32_t c);
// The classes of str.isalpha, str.isdigit and str.isalnum.
bool IsAlpha(char32_t c);
bool IsDigit(char32_t c);
bool IsAlnum(char32_t c);
// str.islower / str.isupper: some cased character, and none of the other case.
bool HasCase(const std::string& s, bool lower);

// str.strip / lstrip / rstrip: `chars` (code points) or whitespace.
std::string Strip(std::string_view s, const Value& chars, bool left, bool right);
// str.upper / str.lower.
std::string MapCase(std::string_view s, bool upper);
// str.title(): the first cased letter after an uncased character is upper.
std::string Title(std::string_view s);
std::string Capitalize(std::string_view s);

// str.splitlines.
std::vector<std::string> SplitLines(std::string_view s, bool keepends);
// str.split / str.rsplit.
Value Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right);
// str.replace; count < 0 replaces all.
std::string Replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
// str.center (side 0), str.ljust (side < 0) and str.rjust (side > 0).
std::string Pad(const std::string& s, int64_t width, const Value& fill_v, int side);

}  // namespace jinja
}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_JINJA_PY_STR_H_
