// The names a template may call on values: jinja2's filters and tests
// (filters.cc) and the str, dict and list methods (methods.cc). The parser
// refuses other filter and test names; Interp::Filter, Interp::Test and
// Interp::CallMethod implement them.
#ifndef CHUNKATTN_TEXT_JINJA_BUILTINS_H_
#define CHUNKATTN_TEXT_JINJA_BUILTINS_H_

#include <string>

#include "text/jinja/value.h"

namespace chunkattn {
namespace jinja {

bool IsFilter(const std::string& name);
bool IsTest(const std::string& name);

// Whether `obj` has a method `name`; *unsafe when the sandbox blocks it (the
// methods that mutate).
bool IsMethod(const Value& obj, const std::string& name, bool* unsafe);

// Whether `name` is in [begin, end), a table of names.
bool Known(const char* const* begin, const char* const* end, const std::string& name);

}  // namespace jinja
}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_JINJA_BUILTINS_H_
