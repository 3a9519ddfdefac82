// The lexer: a template's text cut into segments (literal text, {{ ... }} and
// {% ... %} with their tokens), with jinja2's whitespace rules (trim_blocks,
// lstrip_blocks, the - and + modifiers); comments are dropped and raw blocks
// become text.
#ifndef CHUNKATTN_TEXT_JINJA_LEXER_H_
#define CHUNKATTN_TEXT_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace chunkattn {
namespace jinja {

enum class Tok { kName, kString, kInt, kFloat, kOp, kEnd };

// One token of a tag.
struct Token {
  Tok type = Tok::kEnd;
  std::string text;  // name, operator, or the decoded string literal
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

// Literal text, or one {{ ... }} or {% ... %} tag.
struct Segment {
  enum Type { kText, kExpr, kStmt } type;
  std::string text;           // kText
  std::vector<Token> tokens;  // kExpr, kStmt; ends with a kEnd token
  int line = 0;
};

// The segments of `source` (valid UTF-8). Fails, naming the line, on an
// unclosed tag, comment or string, or a character no token starts with.
std::vector<Segment> Lex(std::string source);

// Whether `c` may continue a name (ASCII letters, digits, '_'); str.format's
// field names take the same characters.
bool IsNameChar(char c);

}  // namespace jinja
}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_JINJA_LEXER_H_
