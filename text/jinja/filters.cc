// jinja2's filters (Interp::Filter) and tests (Interp::Test), as the sandbox
// and transformers' tojson define them.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "text/jinja/builtins.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/py_str.h"
#include "text/jinja/repr.h"
#include "text/utf8.h"

namespace chunkattn {
namespace jinja {

namespace {

// The filters and tests implemented below; the parser refuses any other name.
const char* const kFilters[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "first", "float", "indent",
    "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
    "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string",
    "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", "e", "escape", "batch",
    "center"};
const char* const kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even",
    "false", "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le",
    "<=", "lower", "lt", "lessthan", "<", "mapping", "ne", "!=", "none", "number", "odd",
    "sameas", "sequence", "string", "true", "undefined", "upper", "filter", "test"};

// Python's len().
size_t Length(const Value& v) {
  switch (v.kind) {
    case Kind::kString: return CodePointCount(v.str());
    case Kind::kList: return v.list->size();
    case Kind::kDict:
      if (v.ns) break;
      return v.dict->items.size();
    case Kind::kUndefined: return 0;
    default: break;
  }
  Fail(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
}

// Python's float(str): surrounding whitespace allowed, inf/nan spelled out.
bool ParsePyFloat(const std::string& text, double* out) {
  const std::string s = Strip(text, Value(), true, true);
  if (s.empty()) return false;
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1])))
        return false;
      continue;
    }
    clean += s[i];
  }
  std::string lower = clean;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string body = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? std::nan("") : std::numeric_limits<double>::infinity();
    *out = lower[0] == '-' ? -v : v;
    return true;
  }
  if (body.find_first_not_of("0123456789.e+-") != std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size();
}

// Python's int(str, base), within int64.
bool ParsePyInt(const std::string& text, int base, int64_t* out) {
  std::string s = Strip(text, Value(), true, true);
  if (s.empty()) return false;
  std::string clean;
  for (char c : s)
    if (c != '_') clean += c;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(clean.c_str(), &end, base);
  if (errno == ERANGE || end != clean.c_str() + clean.size()) return false;
  *out = v;
  return true;
}

// The attribute path of filters such as map(attribute="a.b") or sort(attribute=...).
Value AttributePath(Interp& in, Value v, const Value& path) {
  if (path.kind == Kind::kInt) return in.GetItem(v, path);
  if (path.kind != Kind::kString) Fail("attribute must be a string");
  const Value parts = Split(path.str(), Value::Str("."), -1, false);  // kept alive for the loop
  for (const Value& part : *parts.list) {
    int64_t index;
    v = ParsePyInt(part.str(), 10, &index) ? in.GetItem(v, Value::Int(index)) : in.GetItem(v, part);
  }
  return v;
}

// The key filters sort by: lowercased strings unless case_sensitive.
Value SortKey(Value v, bool case_sensitive) {
  if (!case_sensitive && v.kind == Kind::kString) return Value::Str(MapCase(v.str(), false));
  return v;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

bool IsFilter(const std::string& name) { return Known(std::begin(kFilters), std::end(kFilters), name); }
bool IsTest(const std::string& name) { return Known(std::begin(kTests), std::end(kTests), name); }

Value Interp::Filter(const std::string& name, const Value& v, const Args& a) {
  auto str_of = [&](const Value& x) {
    if (x.unsafe) FailUndefined(x);
    return PyStr(x);
  };
  if (name == "trim") return Value::Str(Strip(str_of(v), a.Get(0, "chars"), true, true));
  if (name == "length" || name == "count") return Value::Int(static_cast<int64_t>(Length(v)));
  if (name == "tojson") {  // transformers' tojson(x, ensure_ascii, indent, separators, sort_keys)
    JsonStyle style;
    style.ensure_ascii = Truthy(a.Get(0, "ensure_ascii"));
    const Value indent = a.Get(1, "indent");
    if (indent.kind == Kind::kString) Fail("a string indent is not supported");
    if (!indent.is_undefined() && indent.kind != Kind::kNone) {
      style.indent = static_cast<int>(std::clamp<int64_t>(AsInt(indent), 0, 1 << 10));
      style.item_sep = ",";
    }
    const Value separators = a.Get(2, "separators");
    if (!separators.is_undefined() && separators.kind != Kind::kNone) {
      if (separators.kind != Kind::kList || separators.list->size() != 2 ||
          (*separators.list)[0].kind != Kind::kString || (*separators.list)[1].kind != Kind::kString)
        Fail("separators must be a pair of strings");
      style.item_sep = (*separators.list)[0].str();
      style.key_sep = (*separators.list)[1].str();
    }
    style.sort_keys = Truthy(a.Get(3, "sort_keys"));
    std::string out;
    Json(v, style, 0, &out);
    return Value::Str(std::move(out));
  }
  if (name == "upper") return Value::Str(MapCase(str_of(v), true));
  if (name == "lower") return Value::Str(MapCase(str_of(v), false));
  if (name == "title") return Value::Str(Title(str_of(v)));
  if (name == "capitalize") return Value::Str(Capitalize(str_of(v)));
  if (name == "string") return Value::Str(str_of(v));
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value::Str(HtmlEscape(str_of(v)));
  if (name == "d" || name == "default") {
    const Value dflt = a.pos.empty() && a.kw.empty() ? Value::Str("") : a.Get(0, "default_value");
    if (v.is_undefined() || (Truthy(a.Get(1, "boolean")) && !Truthy(v))) return dflt;
    return v;
  }
  if (name == "first") {
    const std::vector<Value> items = Iterate(v);
    return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    const std::vector<Value> items = Iterate(v);
    return items.empty() ? Value::Undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "list") return Value::MakeList(Iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::MakeList({});
    if (v.kind != Kind::kDict || v.ns) Fail("Can only get item pairs from a mapping.");
    return CallMethod(v, "items", Args());
  }
  if (name == "join") {
    const Value sep = a.Get(0, "d"), attr = a.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(v)) {
      if (!first) out += sep.is_undefined() ? "" : str_of(sep);
      out += str_of(attr.is_undefined() ? item : AttributePath(*this, item, attr));
      first = false;
      if (out.size() > limits_.max_output_bytes) Fail("string too long");
    }
    return Value::Str(std::move(out));
  }
  if (name == "reverse") {
    if (v.kind == Kind::kString) {
      std::vector<char32_t> cps = CodePoints(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value::Str(FromCodePoints(cps.data(), cps.data() + cps.size()));
    }
    std::vector<Value> items = Iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "abs") {
    if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.f));
    const int64_t x = AsInt(v);
    if (x == std::numeric_limits<int64_t>::min()) Fail("integer overflow");
    return Value::Int(x < 0 ? -x : x);
  }
  if (name == "int") {
    const Value dflt = a.pos.empty() && a.kw.empty() ? Value::Int(0) : a.Get(0, "default");
    const Value base_v = a.Get(1, "base");
    const int base = base_v.is_undefined() ? 10 : static_cast<int>(AsInt(base_v));
    if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::Int(AsInt(v));
    if (v.kind == Kind::kFloat) {
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return dflt;
      return Value::Int(static_cast<int64_t>(std::trunc(v.f)));
    }
    if (v.kind == Kind::kString) {
      int64_t x;
      if (ParsePyInt(v.str(), base, &x)) return Value::Int(x);
      double d;
      if (ParsePyFloat(v.str(), &d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
        return Value::Int(static_cast<int64_t>(std::trunc(d)));
    }
    return dflt;
  }
  if (name == "float") {
    const Value dflt = a.pos.empty() && a.kw.empty() ? Value::Float(0) : a.Get(0, "default");
    if (v.is_number()) return Value::Float(AsDouble(v));
    double d;
    if (v.kind == Kind::kString && ParsePyFloat(v.str(), &d)) return Value::Float(d);
    return dflt;
  }
  if (name == "round") {
    const Value p = a.Get(0, "precision"), method_v = a.Get(1, "method");
    const std::string method = method_v.kind == Kind::kString ? method_v.str() : "common";
    const int64_t precision = p.is_undefined() ? 0 : AsInt(p);
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = AsDouble(v) * scale;
    double r;
    if (method == "common") r = std::nearbyint(x);
    else if (method == "ceil") r = std::ceil(x);
    else if (method == "floor") r = std::floor(x);
    else Fail("method must be common, ceil or floor");
    if (method == "common" && v.kind != Kind::kFloat) return Value::Int(AsInt(v));
    return Value::Float(r / scale);
  }
  if (name == "indent") {
    const Value width = a.Get(0, "width");
    std::string indention = width.kind == Kind::kString ? width.str()
                            : std::string(static_cast<size_t>(std::clamp<int64_t>(width.is_undefined() ? 4 : AsInt(width), 0, 1 << 16)), ' ');
    const bool first = Truthy(a.Get(1, "first")), blank = Truthy(a.Get(2, "blank"));
    const std::vector<std::string> lines = SplitLines(str_of(v) + "\n", false);
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k > 0) out += "\n" + ((blank || !lines[k].empty()) ? indention : "");
      out += lines[k];
    }
    if (first) out = indention + out;
    return Value::Str(std::move(out));
  }
  if (name == "replace") {
    const Value count = a.Get(2, "count");
    return Value::Str(Replace(str_of(v), str_of(a.Get(0, "old")), str_of(a.Get(1, "new")),
                              count.is_undefined() || count.kind == Kind::kNone ? -1 : AsInt(count)));
  }
  if (name == "center") {
    const Value width = a.Get(0, "width");
    return Value::Str(Pad(str_of(v), width.is_undefined() ? 80 : AsInt(width), Value(), 0));
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    const std::string s = str_of(v);
    for (size_t i = 0; i < s.size();) {
      const auto [cp, len] = CodePointAt(s, i);
      const bool word = IsAlnum(cp) || cp == '_';
      n += word && !in_word;
      in_word = word;
      i += len;
    }
    return Value::Int(n);
  }
  if (name == "attr") return GetAttr(v, str_of(a.Get(0, "name")));
  if (name == "dictsort") {
    if (v.kind != Kind::kDict || v.ns) Fail("You can only sort by either \"key\" or \"value\" of a dict");
    const bool cs = Truthy(a.Get(0, "case_sensitive"));
    const Value by_v = a.Get(1, "by");
    const bool by_value = by_v.kind == Kind::kString && by_v.str() == "value";
    if (by_v.kind == Kind::kString && by_v.str() != "key" && !by_value)
      Fail("You can only sort by either \"key\" or \"value\"");
    std::vector<std::pair<Value, Value>> items = v.dict->items;
    std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
      return Compare(SortKey(by_value ? x.second : x.first, cs), SortKey(by_value ? y.second : y.first, cs)) < 0;
    });
    if (Truthy(a.Get(2, "reverse"))) std::reverse(items.begin(), items.end());
    List out;
    for (auto& [k, val] : items) out.push_back(Value::MakeList({k, val}, true));
    return Value::MakeList(std::move(out));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    const bool is_sort = name == "sort";
    const bool cs = Truthy(a.Get(is_sort ? 1 : 0, "case_sensitive"));
    const Value attr = a.Get(is_sort ? 2 : 1, "attribute");
    auto key = [&](const Value& x) {
      return SortKey(attr.is_undefined() || attr.kind == Kind::kNone ? x : AttributePath(*this, x, attr), cs);
    };
    std::vector<Value> items = Iterate(v);
    if (name == "unique") {
      std::vector<Value> out, seen;
      for (Value& x : items) {
        const Value k = key(x);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, k); })) {
          seen.push_back(k);
          out.push_back(std::move(x));
        }
      }
      return Value::MakeList(std::move(out));
    }
    if (!is_sort) {
      if (items.empty()) return Value::Undefined(absl::StrCat("No aggregated item, sequence was empty."));
      size_t best = 0;
      for (size_t k = 1; k < items.size(); ++k) {
        const int c = Compare(key(items[k]), key(items[best]));
        if (name == "min" ? c < 0 : c > 0) best = k;
      }
      return items[best];
    }
    const bool reverse = Truthy(a.Get(0, "reverse"));
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? Compare(key(y), key(x)) < 0 : Compare(key(x), key(y)) < 0;
    });
    return Value::MakeList(std::move(items));
  }
  if (name == "sum") {
    const Value attr = a.Get(0, "attribute"), start = a.Get(1, "start");
    Value total = start.is_undefined() ? Value::Int(0) : start;
    for (const Value& x : Iterate(v)) total = Arith("+", total, attr.is_undefined() ? x : AttributePath(*this, x, attr));
    return total;
  }
  if (name == "map") {
    List out;
    const Value attr = a.Get(99, "attribute");
    if (!attr.is_undefined()) {
      const Value dflt = a.Get(99, "default");
      for (const Value& x : Iterate(v)) {
        Value r = AttributePath(*this, x, attr);
        out.push_back(r.is_undefined() && !dflt.is_undefined() ? dflt : r);
      }
      return Value::MakeList(std::move(out));
    }
    if (a.pos.empty() || a.pos[0].kind != Kind::kString) Fail("map requires a filter argument");
    const std::string filter = a.pos[0].str();
    if (!IsFilter(filter)) Fail("No filter named '" + filter + "'");
    Args rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& x : Iterate(v)) {
      Step();
      out.push_back(Filter(filter, x, rest));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    const size_t test_at = by_attr ? 1 : 0;
    std::string test;
    if (a.pos.size() > test_at) {
      if (a.pos[test_at].kind != Kind::kString) Fail("a test name must be a string");
      test = a.pos[test_at].str();
      if (!IsTest(test)) Fail("No test named '" + test + "'");
    }
    Args rest;
    if (a.pos.size() > test_at + 1) rest.pos.assign(a.pos.begin() + static_cast<long>(test_at) + 1, a.pos.end());
    List out;
    for (const Value& x : Iterate(v)) {
      Step();
      const Value subject = by_attr ? AttributePath(*this, x, a.Get(0, "attribute")) : x;
      const bool r = test.empty() ? Truthy(subject) : Test(test, subject, rest);
      if (r == keep_if) out.push_back(x);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "batch") {
    const int64_t n = AsInt(a.Get(0, "linecount"));
    if (n <= 0) Fail("batch size must be positive");
    const Value fill = a.Get(1, "fill_with");
    List out, cur;
    for (const Value& x : Iterate(v)) {
      cur.push_back(x);
      if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::MakeList(std::exchange(cur, {})));
    }
    if (!cur.empty()) {
      if (!fill.is_undefined() && fill.kind != Kind::kNone)
        while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
      out.push_back(Value::MakeList(std::move(cur)));
    }
    return Value::MakeList(std::move(out));
  }
  Fail("No filter named '" + name + "'");
}

bool Interp::Test(const std::string& name, const Value& v, const Args& a) {
  const Value arg = a.Get(0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == Kind::kNone;
  if (name == "string") return v.kind == Kind::kString;
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "true") return v.kind == Kind::kBool && v.b;
  if (name == "false") return v.kind == Kind::kBool && !v.b;
  if (name == "mapping") return v.kind == Kind::kDict && !v.ns;
  if (name == "iterable") return v.kind == Kind::kString || v.kind == Kind::kList || (v.kind == Kind::kDict && !v.ns) || v.is_undefined();
  if (name == "sequence") return v.kind == Kind::kString || v.kind == Kind::kList || (v.kind == Kind::kDict && !v.ns) || v.is_undefined();
  if (name == "callable") return v.kind == Kind::kCallable;
  if (name == "escaped") return false;
  if (name == "lower") return v.kind == Kind::kString && HasCase(v.str(), true);
  if (name == "upper") return v.kind == Kind::kString && HasCase(v.str(), false);
  if (name == "even" || name == "odd") {
    const int64_t x = AsInt(v);
    return (x % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const int64_t d = AsInt(arg);
    if (d == 0) Fail("integer division or modulo by zero");
    return AsInt(v) % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, arg);
  if (name == "ne" || name == "!=") return !Equal(v, arg);
  if (name == "lt" || name == "lessthan" || name == "<") return Compare(v, arg) < 0;
  if (name == "le" || name == "<=") return Compare(v, arg) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return Compare(v, arg) > 0;
  if (name == "ge" || name == ">=") return Compare(v, arg) >= 0;
  if (name == "in") return Contains(arg, v);
  if (name == "sameas") {
    if (v.kind != arg.kind) return false;
    switch (v.kind) {
      case Kind::kNone: case Kind::kUndefined: return v.kind == Kind::kNone;
      case Kind::kBool: return v.b == arg.b;
      case Kind::kInt: return v.i == arg.i && v.i >= -5 && v.i <= 256;  // CPython's small ints
      case Kind::kString: return v.s == arg.s;
      case Kind::kList: return v.list == arg.list;
      case Kind::kDict: return v.dict == arg.dict;
      case Kind::kCallable: return v.fn == arg.fn;
      default: return false;
    }
  }
  if (name == "filter") return v.kind == Kind::kString && IsFilter(v.str());
  if (name == "test") return v.kind == Kind::kString && IsTest(v.str());
  Fail("No test named '" + name + "'");
}

}  // namespace jinja
}  // namespace chunkattn
