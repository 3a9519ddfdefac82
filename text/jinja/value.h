// The engine's values: Python's, as jinja2 sees them (None, bool, int, float,
// str, list and tuple, dict, namespace(), callables, and jinja2's Undefined),
// with Python's truthiness, equality, ordering, iteration and `in`; and the
// error every stage of the engine raises.
#ifndef CHUNKATTN_TEXT_JINJA_VALUE_H_
#define CHUNKATTN_TEXT_JINJA_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nlohmann/json_fwd.hpp"

namespace chunkattn {
namespace jinja {

// Errors travel as this exception inside the engine; ChatTemplate's Parse and
// Render turn it into an absl::Status, so none ever leaves chat_template.cc.
struct Error {
  std::string message;
  bool raised = false;  // raise_exception() in the template
};

[[noreturn]] inline void Fail(std::string message) { throw Error{std::move(message), false}; }

struct Value;
struct Dict;
struct Callable;
class Interp;
using List = std::vector<Value>;

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

struct Value {
  Kind kind = Kind::kUndefined;
  bool tuple = false;      // kList printed as a Python tuple
  bool ns = false;         // kDict made by namespace(): the one mutable value
  bool unsafe = false;     // kUndefined standing for a blocked attribute
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;  // kString; kUndefined: what was missing
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<const Callable> fn;

  static Value Undefined(std::string what) {
    Value v;
    v.s = std::make_shared<const std::string>(std::move(what));
    return v;
  }
  static Value None() { Value v; v.kind = Kind::kNone; return v; }
  static Value Bool(bool x) { Value v; v.kind = Kind::kBool; v.b = x; return v; }
  static Value Int(int64_t x) { Value v; v.kind = Kind::kInt; v.i = x; return v; }
  static Value Float(double x) { Value v; v.kind = Kind::kFloat; v.f = x; return v; }
  static Value Str(std::string x) {
    Value v;
    v.kind = Kind::kString;
    v.s = std::make_shared<const std::string>(std::move(x));
    return v;
  }
  static Value MakeList(List items, bool tuple = false) {
    Value v;
    v.kind = Kind::kList;
    v.tuple = tuple;
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value MakeDict();

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  const std::string& str() const { return *s; }
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k.kind == Kind::kString && k.str() == key) return &v;
    return nullptr;
  }
  void Set(Value key, Value value);
};

inline Value Value::MakeDict() {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>();
  return v;
}

// A call's arguments: positional, then keyword.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The argument `name` at position `index` or by keyword; Undefined if absent.
  Value Get(size_t index, std::string_view name) const {
    for (const auto& [k, v] : kw)
      if (k == name) return v;
    return index < pos.size() ? pos[index] : Value::Undefined(std::string(name));
  }
};

// A function, macro or bound method; `call` runs it in the interpreter.
struct Callable {
  std::string name;
  std::function<Value(Interp&, const Args&)> call;
};

// Python's type name ("str", "NoneType", ...), for error messages.
const char* TypeName(const Value& v);

// Fails with what an undefined value stands for (a missing name, a blocked
// attribute).
[[noreturn]] void FailUndefined(const Value& v);

// A bool, int or float as a double; fails otherwise.
double AsDouble(const Value& v);
// A bool or int; fails otherwise.
int64_t AsInt(const Value& v);

bool Truthy(const Value& v);
bool Equal(const Value& a, const Value& b);

// Python's ordering: numbers with numbers, strings by code point (UTF-8 byte
// order is code point order), lists element by element. -1, 0 or 1; fails for
// values Python does not order.
int Compare(const Value& a, const Value& b);

// Python's iteration: a list's items, a dict's keys, a string's characters;
// an Undefined iterates as empty (one standing for a blocked attribute fails).
std::vector<Value> Iterate(const Value& v);

// Python's `item in container`.
bool Contains(const Value& container, const Value& item);

// A JSON value as Python's json.loads gives it; objects keep their key order.
Value FromJson(const nlohmann::ordered_json& j);

}  // namespace jinja
}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_JINJA_VALUE_H_
