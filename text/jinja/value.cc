// The value model's operations: type names, conversions, Python's truthiness,
// equality and ordering, iteration and `in`, and values from JSON.
#include "text/jinja/value.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "text/utf8.h"

namespace chunkattn {
namespace jinja {

const char* TypeName(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return v.tuple ? "tuple" : "list";
    case Kind::kDict: return v.ns ? "Namespace" : "dict";
    case Kind::kCallable: return "function";
  }
  return "?";
}

[[noreturn]] void FailUndefined(const Value& v) {
  if (v.unsafe) Fail(v.str());
  Fail(v.s ? v.str() : "undefined value");
}

double AsDouble(const Value& v) {
  switch (v.kind) {
    case Kind::kBool: return v.b ? 1 : 0;
    case Kind::kInt: return static_cast<double>(v.i);
    case Kind::kFloat: return v.f;
    default: Fail(absl::StrCat("expected a number, got ", TypeName(v)));
  }
}

int64_t AsInt(const Value& v) {
  if (v.kind == Kind::kBool) return v.b ? 1 : 0;
  if (v.kind == Kind::kInt) return v.i;
  if (v.is_undefined()) FailUndefined(v);
  Fail(absl::StrCat("expected an integer, got ", TypeName(v)));
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0;
    case Kind::kString: return !v.s->empty();
    case Kind::kList: return !v.list->empty();
    case Kind::kDict: return v.ns || !v.dict->items.empty();
    case Kind::kCallable: return true;
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) return AsInt(a) == AsInt(b);
    return AsDouble(a) == AsDouble(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined: case Kind::kNone: return true;
    case Kind::kString: return a.str() == b.str();
    case Kind::kList:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!Equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Kind::kDict:
      if (a.dict == b.dict) return true;
      if (a.ns || b.ns || a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    case Kind::kCallable: return a.fn == b.fn;
    default: return false;
  }
}

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (Equal(k, key)) return &v;
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (Equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

int Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      const int64_t x = AsInt(a), y = AsInt(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const double x = AsDouble(a), y = AsDouble(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::kString && b.kind == Kind::kString) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Kind::kList && b.kind == Kind::kList) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      if (Equal((*a.list)[i], (*b.list)[i])) continue;
      return Compare((*a.list)[i], (*b.list)[i]);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  Fail(absl::StrCat("'<' not supported between instances of '", TypeName(a), "' and '",
                    TypeName(b), "'"));
}

std::vector<Value> Iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kList: return *v.list;
    case Kind::kDict: {
      if (v.ns) Fail("'Namespace' object is not iterable");
      std::vector<Value> keys;
      for (const auto& [k, _] : v.dict->items) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (size_t i = 0; i < v.s->size();) {
        const int len = CodePointAt(*v.s, i).second;
        chars.push_back(Value::Str(v.s->substr(i, len)));
        i += len;
      }
      return chars;
    }
    case Kind::kUndefined:
      if (v.unsafe) FailUndefined(v);
      return {};
    default: Fail(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kString:
      if (item.kind != Kind::kString)
        Fail(absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      return std::any_of(container.list->begin(), container.list->end(),
                         [&](const Value& x) { return Equal(x, item); });
    case Kind::kDict:
      if (container.ns) break;
      return container.dict->Find(item) != nullptr;
    case Kind::kUndefined: FailUndefined(container);
    default: break;
  }
  Fail(absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::None();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::MakeDict();
      d.dict->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->items.emplace_back(Value::Str(it.key()), FromJson(it.value()));
      return d;
    }
    default: return Value::None();
  }
}

}  // namespace jinja
}  // namespace chunkattn
