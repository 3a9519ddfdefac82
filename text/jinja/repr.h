// How values print: Python's str() and repr(), and json.dumps as
// transformers' tojson calls it.
#ifndef CHUNKATTN_TEXT_JINJA_REPR_H_
#define CHUNKATTN_TEXT_JINJA_REPR_H_

#include <string>

#include "text/jinja/value.h"

namespace chunkattn {
namespace jinja {

// str(v); what {{ v }} writes. An Undefined prints as "".
std::string PyStr(const Value& v);
// repr(v).
std::string Repr(const Value& v);

// json.dumps as transformers' tojson calls it. Without separators: ", " and
// ": ", or "," and ": " with an indent. ensure_ascii writes \uXXXX (surrogate
// pairs beyond the BMP).
struct JsonStyle {
  int indent = -1;  // none
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// Appends json.dumps(v) at nesting `level` to *out; fails for values JSON
// cannot hold (a namespace, a callable, an Undefined).
void Json(const Value& v, const JsonStyle& style, int level, std::string* out);

}  // namespace jinja
}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_JINJA_REPR_H_
