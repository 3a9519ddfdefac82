// The parser: the lexer's segments into a syntax tree. Expressions follow
// jinja2's precedence; statements are the tags listed in chat_template.h.
#ifndef CHUNKATTN_TEXT_JINJA_PARSER_H_
#define CHUNKATTN_TEXT_JINJA_PARSER_H_

#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace chunkattn {
namespace jinja {

// The template's statements. Fails, naming the line, on a syntax error, an
// unknown or unsupported tag, an unknown filter or test, or nesting deeper
// than the parser allows.
Body Parse(std::vector<Segment> segments);

}  // namespace jinja
}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_JINJA_PARSER_H_
