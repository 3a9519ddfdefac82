#include "text/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "text/utf8.h"
#include "utf8proc.h"

namespace chunkattn {
namespace jinja {
namespace {

// Errors travel as this exception inside the engine; Parse and Render turn it
// into an absl::Status, so none ever leaves this file.
struct Error {
  std::string message;
  bool raised = false;  // raise_exception() in the template
};

[[noreturn]] void Fail(std::string message) { throw Error{std::move(message), false}; }

// ---------------------------------------------------------------------------
// Values: Python's, as jinja2 sees them.

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

Value Value::MakeDict() {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>();
  return v;
}

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

struct Callable {
  std::string name;
  std::function<Value(Interp&, const Args&)> call;
};

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

// Python's ordering: numbers with numbers, strings by code point (UTF-8 byte
// order is code point order), lists element by element.
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

// --- Unicode, as Python's str sees it ---------------------------------------

std::vector<char32_t> CodePoints(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = CodePointAt(s, i);
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string FromCodePoints(const char32_t* begin, const char32_t* end) {
  std::string out;
  for (const char32_t* p = begin; p != end; ++p) AppendUtf8(*p, &out);
  return out;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// str.isspace(): bidirectional class WS, B or S, or category Zs.
bool IsPySpace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}

// str.strip / lstrip / rstrip: `chars` (code points) or whitespace.
std::string Strip(std::string_view s, const Value& chars, bool left, bool right) {
  const std::vector<char32_t> cps = CodePoints(s);
  std::vector<char32_t> set;
  const bool by_set = chars.kind == Kind::kString;
  if (by_set) set = CodePoints(chars.str());
  else if (!chars.is_undefined() && chars.kind != Kind::kNone) Fail("strip arg must be None or str");
  auto drop = [&](char32_t c) {
    return by_set ? std::find(set.begin(), set.end(), c) != set.end() : IsPySpace(c);
  };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && drop(cps[b])) ++b;
  if (right) while (e > b && drop(cps[e - 1])) --e;
  return FromCodePoints(cps.data() + b, cps.data() + e);
}

std::string MapCase(std::string_view s, bool upper) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = CodePointAt(s, i);
    AppendUtf8(static_cast<char32_t>(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp)), &out);
    i += len;
  }
  return out;
}

bool IsCased(char32_t c) {
  return utf8proc_toupper(c) != static_cast<utf8proc_int32_t>(c) ||
         utf8proc_tolower(c) != static_cast<utf8proc_int32_t>(c);
}

// str.title(): the first cased letter after an uncased character is upper.
std::string Title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = CodePointAt(s, i);
    const bool cased = IsCased(cp);
    AppendUtf8(static_cast<char32_t>(cased ? (prev_cased ? utf8proc_tolower(cp)
                                                         : utf8proc_totitle(cp))
                                           : cp), &out);
    prev_cased = cased;
    i += len;
  }
  return out;
}

std::string Capitalize(std::string_view s) {
  if (s.empty()) return "";
  const auto [cp, len] = CodePointAt(s, 0);
  std::string out;
  AppendUtf8(static_cast<char32_t>(utf8proc_totitle(cp)), &out);
  return out + MapCase(s.substr(len), false);
}

bool IsPrintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

// --- str() and repr() ---------------------------------------------------------

// float.__repr__: the shortest digits that round-trip, fixed notation for
// exponents in [-4, 16), else d.ddde+XX.
std::string FloatRepr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string sci = buf;  // [-]d.ddde[+-]XX
  const size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string sign = sci[0] == '-' ? "-" : "";
  std::string digits;
  for (size_t i = sign.size(); i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return sign + out;
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return sign + mantissa + exp_buf;
}

std::string Repr(const Value& v);

std::string StrRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = CodePointAt(s, i);
    i += len;
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!IsPrintable(cp)) {
      char buf[16];
      if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
      else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      AppendUtf8(cp, &out);
    }
  }
  out += quote;
  return out;
}

std::string PyStr(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return FloatRepr(v.f);
    case Kind::kString: return v.str();
    default: return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kString: return StrRepr(v.str());
    case Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        out += Repr((*v.list)[i]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = v.ns ? "<Namespace {" : "{";
      for (size_t i = 0; i < v.dict->items.size(); ++i) {
        if (i) out += ", ";
        out += Repr(v.dict->items[i].first) + ": " + Repr(v.dict->items[i].second);
      }
      return out + (v.ns ? "}>" : "}");
    }
    case Kind::kCallable: return "<function " + v.fn->name + ">";
    default: return PyStr(v);
  }
}

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

void JsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const auto [cp, len] = CodePointAt(s, i);
      if (ensure_ascii) {
        char buf[16];
        if (cp >= 0x10000) {
          const unsigned v = static_cast<unsigned>(cp) - 0x10000;
          std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        } else {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
        }
        *out += buf;
      } else {
        out->append(s.substr(i, len));
      }
      i += len;
      continue;
    }
    ++i;
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

void Json(const Value& v, const JsonStyle& style, int level, std::string* out) {
  auto newline = [&](int lvl) {
    if (style.indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(style.indent) * lvl, ' ');
  };
  switch (v.kind) {
    case Kind::kNone: *out += "null"; return;
    case Kind::kBool: *out += v.b ? "true" : "false"; return;
    case Kind::kInt: *out += std::to_string(v.i); return;
    case Kind::kFloat:
      if (std::isnan(v.f)) *out += "NaN";
      else if (std::isinf(v.f)) *out += v.f > 0 ? "Infinity" : "-Infinity";
      else *out += FloatRepr(v.f);
      return;
    case Kind::kString: JsonString(v.str(), style.ensure_ascii, out); return;
    case Kind::kList: {
      if (v.list->empty()) { *out += "[]"; return; }
      *out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) *out += style.item_sep;
        newline(level + 1);
        Json((*v.list)[i], style, level + 1, out);
      }
      newline(level);
      *out += ']';
      return;
    }
    case Kind::kDict: {
      if (v.ns) Fail("Object of type Namespace is not JSON serializable");
      if (v.dict->items.empty()) { *out += "{}"; return; }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (style.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return Compare(a->first, b->first) < 0; });
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += style.item_sep;
        newline(level + 1);
        const Value& key = items[i]->first;
        switch (key.kind) {
          case Kind::kString: JsonString(key.str(), style.ensure_ascii, out); break;
          case Kind::kNone: *out += "\"null\""; break;
          case Kind::kBool: *out += key.b ? "\"true\"" : "\"false\""; break;
          case Kind::kInt: case Kind::kFloat: JsonString(PyStr(key), false, out); break;
          default: Fail(absl::StrCat("keys must be str, int, float, bool or None, not ", TypeName(key)));
        }
        *out += style.key_sep;
        Json(items[i]->second, style, level + 1, out);
      }
      newline(level);
      *out += '}';
      return;
    }
    default:
      Fail(absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
  }
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

// ---------------------------------------------------------------------------
// Lexing: the template's text and its tags, with jinja2's whitespace rules
// (trim_blocks, lstrip_blocks, the - and + modifiers).

enum class Tok { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok type = Tok::kEnd;
  std::string text;  // name, operator, or the decoded string literal
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

struct Segment {
  enum Type { kText, kExpr, kStmt } type;
  std::string text;           // kText
  std::vector<Token> tokens;  // kExpr, kStmt; ends with a kEnd token
  int line = 0;
};

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Jinja string literals decode Python's escapes.
std::string DecodeStringLiteral(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int digits) {
      const std::string h(body.substr(i + 1, digits));
      if (static_cast<int>(h.size()) != digits ||
          h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        Fail(absl::StrCat("line ", line, ": bad \\", std::string(1, e), " escape"));
      i += digits;
      const unsigned long cp = std::stoul(h, nullptr, 16);
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        Fail(absl::StrCat("line ", line, ": escape outside Unicode scalar values"));
      AppendUtf8(static_cast<char32_t>(cp), &out);
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (e >= '0' && e <= '7') {
          int value = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            value = value * 8 + (body[++i] - '0');
          AppendUtf8(static_cast<char32_t>(value), &out);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    // jinja2 normalizes newlines and drops one trailing newline.
    std::string normalized;
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\r') {
        normalized += '\n';
        if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
      } else {
        normalized += src_[i];
      }
    }
    if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
    src_ = std::move(normalized);
  }

  std::vector<Segment> Run() {
    std::vector<Segment> out;
    size_t pos = 0;
    bool line_starting = true;  // the previous tag ended a line
    bool strip_next = false;    // a "-" closed the previous tag
    while (pos <= src_.size()) {
      const size_t open = FindOpen(pos);
      std::string text = src_.substr(pos, (open == std::string::npos ? src_.size() : open) - pos);
      if (strip_next) text = Strip(text, Value(), true, false);
      strip_next = false;
      if (open == std::string::npos) {
        AddText(std::move(text), &out);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      size_t p = open + 2;
      const char modifier = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (modifier) ++p;
      if (modifier == '-') {
        text = Strip(text, Value(), false, true);
      } else if (kind != '{' && modifier != '+') {
        // lstrip_blocks: whitespace alone between a line's start and a tag.
        const size_t line_start = text.rfind('\n');
        const size_t from = line_start == std::string::npos ? 0 : line_start + 1;
        if ((line_start != std::string::npos || line_starting) && from < text.size() &&
            Strip(std::string_view(text).substr(from), Value(), true, false).empty()) {
          text.resize(from);
        }
      }
      const int line = LineOf(open);
      AddText(std::move(text), &out);
      if (kind == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string::npos) Fail(absl::StrCat("line ", line, ": unclosed comment"));
        pos = close + 2;
        strip_next = close > p && src_[close - 1] == '-';
        const bool keep = close > p && src_[close - 1] == '+';
        line_starting = false;
        if (!strip_next && !keep && pos < src_.size() && src_[pos] == '\n') {
          ++pos;
          line_starting = true;
        }
        continue;
      }
      Segment seg{kind == '{' ? Segment::kExpr : Segment::kStmt, "", {}, line};
      char close_modifier = 0;
      pos = LexTag(p, kind == '{' ? '}' : '%', &seg.tokens, &close_modifier);
      strip_next = close_modifier == '-';
      line_starting = false;
      if (kind == '%' && close_modifier == 0 && pos < src_.size() && src_[pos] == '\n') {
        ++pos;  // trim_blocks
        line_starting = true;
      }
      if (kind == '%' && seg.tokens.size() >= 2 && seg.tokens[0].type == Tok::kName &&
          seg.tokens[0].text == "raw") {
        pos = LexRaw(pos, line, &out, &strip_next, &line_starting);
        continue;
      }
      out.push_back(std::move(seg));
    }
    return out;
  }

 private:
  size_t FindOpen(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  int LineOf(size_t pos) const {
    return 1 + static_cast<int>(std::count(src_.begin(), src_.begin() + static_cast<long>(pos), '\n'));
  }

  static void AddText(std::string text, std::vector<Segment>* out) {
    if (!text.empty()) out->push_back(Segment{Segment::kText, std::move(text), {}, 0});
  }

  // Tokens up to the closing "}}" or "%}" (outside string literals).
  size_t LexTag(size_t p, char closer, std::vector<Token>* tokens, char* close_modifier) {
    const int line = LineOf(p);
    int depth = 0;  // brackets: "}}" inside a dict literal is two braces
    while (true) {
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (p >= src_.size()) Fail(absl::StrCat("line ", line, ": unclosed tag"));
      const char c = src_[p];
      if (depth == 0 && (c == '-' || c == '+') && p + 2 < src_.size() + 0 &&
          src_[p + 1] == closer && src_[p + 2] == '}') {
        *close_modifier = c;
        tokens->push_back(Token{Tok::kEnd, "", 0, 0, line});
        return p + 3;
      }
      if (depth == 0 && c == closer && p + 1 < src_.size() && src_[p + 1] == '}') {
        tokens->push_back(Token{Tok::kEnd, "", 0, 0, line});
        return p + 2;
      }
      Token t;
      t.line = line;
      if (IsNameStart(c)) {
        size_t e = p;
        while (e < src_.size() && IsNameChar(src_[e])) ++e;
        t.type = Tok::kName;
        t.text = src_.substr(p, e - p);
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t x = e + 1;
          if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
          if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
            is_float = true;
            e = x;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string digits;
        for (size_t k = p; k < e; ++k)
          if (src_[k] != '_') digits += src_[k];
        if (is_float) {
          t.type = Tok::kFloat;
          t.f = std::strtod(digits.c_str(), nullptr);
        } else {
          t.type = Tok::kInt;
          errno = 0;
          t.i = std::strtoll(digits.c_str(), nullptr, 10);
          if (errno == ERANGE) Fail(absl::StrCat("line ", line, ": integer literal too large"));
        }
        p = e;
      } else if (c == '\'' || c == '"') {
        size_t e = p + 1;
        while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= src_.size()) Fail(absl::StrCat("line ", line, ": unterminated string"));
        t.type = Tok::kString;
        t.text = DecodeStringLiteral(std::string_view(src_).substr(p + 1, e - p - 1), line);
        p = e + 1;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/", "%", "~", "<", ">", "=", "(", ")", "[", "]",
                                           "{", "}", ",", ".", ":", "|"};
        const char* found = nullptr;
        for (const char* op : kOps) {
          if (src_.compare(p, std::strlen(op), op) == 0) {
            found = op;
            break;
          }
        }
        if (found == nullptr) Fail(absl::StrCat("line ", line, ": unexpected character '", std::string(1, c), "'"));
        t.type = Tok::kOp;
        t.text = found;
        p += t.text.size();
        if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
        if ((t.text == ")" || t.text == "]" || t.text == "}") && depth > 0) --depth;
      }
      tokens->push_back(std::move(t));
    }
  }

  // The body of {% raw %} ... {% endraw %}, as text.
  size_t LexRaw(size_t pos, int line, std::vector<Segment>* out, bool* strip_next, bool* line_starting) {
    size_t search = pos;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) Fail(absl::StrCat("line ", line, ": missing endraw"));
      size_t p = open + 2;
      const char modifier = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (modifier) ++p;
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      char close_modifier = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) close_modifier = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) Fail(absl::StrCat("line ", line, ": bad endraw tag"));
      std::string text = src_.substr(pos, open - pos);
      if (*strip_next) text = Strip(text, Value(), true, false);
      if (modifier == '-') text = Strip(text, Value(), false, true);
      AddText(std::move(text), out);
      pos = p + 2;
      *strip_next = close_modifier == '-';
      *line_starting = false;
      if (close_modifier == 0 && pos < src_.size() && src_[pos] == '\n') {
        ++pos;
        *line_starting = true;
      }
      return pos;
    }
  }

  std::string src_;
};

// ---------------------------------------------------------------------------
// The syntax tree.

struct Expr {
  enum Type {
    kConst, kName, kList, kTuple, kDict, kAttr, kItem, kSlice, kCall, kFilter, kTest,
    kNeg, kPos, kNot, kAnd, kOr, kBinary, kCompare, kCond, kConcat
  } type;
  int line = 0;
  Value value;                               // kConst
  std::string name;                          // kName, kAttr, kFilter, kTest, kBinary's op
  std::vector<std::unique_ptr<Expr>> kids;   // operands; for kCall/kFilter/kTest: [obj, args...]
  std::vector<std::string> kw_names;         // names of the trailing keyword arguments
  std::vector<std::string> ops;              // kCompare: the operators between kids
  bool negate = false;                       // kTest: "is not"
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum Type { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue } type;
  int line = 0;
  std::string text;                   // kText
  ExprPtr expr;                       // kOutput, kSet value, kFor iterable
  std::vector<ExprPtr> conds;         // kIf: one per branch; kFor: [filter] if any
  std::vector<Body> bodies;           // kIf: per branch (+ else); kFor: body (+ else)
  std::vector<std::string> targets;   // kFor, kSet: names; kSet "ns.attr": {"ns", "attr"} with attr_target
  bool attr_target = false;
  std::string macro_name;             // kMacro
  std::vector<std::string> params;    // kMacro
  std::vector<ExprPtr> defaults;      // kMacro: one per param (null when none)
};

}  // namespace

struct Program {
  Body body;
};

namespace {

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

bool Known(const char* const* begin, const char* const* end, const std::string& name) {
  return std::any_of(begin, end, [&](const char* n) { return name == n; });
}

// Recursion in the parsers is bounded: a hostile template of a million "("
// or nested ifs is an error, not a stack overflow.
constexpr int kMaxParseNesting = 256;

struct NestingGuard {
  NestingGuard(int* depth, int line) : depth_(depth) {
    if (++*depth_ > kMaxParseNesting) {
      Fail(absl::StrCat("line ", line, ": nested deeper than ", kMaxParseNesting));
    }
  }
  ~NestingGuard() { --*depth_; }
  int* depth_;
};

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& tokens, size_t pos) : t_(tokens), pos_(pos) {}
  size_t pos() const { return pos_; }
  const Token& cur() const { return t_[pos_]; }
  bool AtEnd() const { return cur().type == Tok::kEnd; }
  bool IsOp(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool IsName(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  [[noreturn]] void Unexpected() const {
    Fail(absl::StrCat("line ", cur().line, ": unexpected ",
                      AtEnd() ? std::string("end of tag") : "'" + cur().text + "'"));
  }
  void Expect(const char* op) {
    if (!IsOp(op)) {
      Fail(absl::StrCat("line ", cur().line, ": expected '", op, "', got ",
                        AtEnd() ? std::string("end of tag") : "'" + cur().text + "'"));
    }
    ++pos_;
  }
  std::string ExpectName() {
    if (cur().type != Tok::kName) Unexpected();
    return t_[pos_++].text;
  }

  ExprPtr Make(Expr::Type type) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = cur().line;
    return e;
  }

  // A tuple without parentheses where jinja allows one ({% set %}, {% for %}).
  // with_cond false: the elements take no "x if c else y" (a for loop's
  // iterable, whose "if" is the loop's filter).
  ExprPtr ParseTuple(bool with_cond = true) {
    auto element = [&]() { return with_cond ? ParseExpression() : ParseOr(); };
    ExprPtr first = element();
    if (!IsOp(",")) return first;
    ExprPtr tuple = Make(Expr::kTuple);
    tuple->kids.push_back(std::move(first));
    while (IsOp(",")) {
      ++pos_;
      if (AtEnd() || IsName("if")) break;
      tuple->kids.push_back(element());
    }
    return tuple;
  }

  ExprPtr ParseExpression() {
    const NestingGuard guard(&depth_, cur().line);
    ExprPtr e = ParseOr();
    if (IsName("if")) {
      ++pos_;
      ExprPtr cond = ParseOr();
      ExprPtr other;
      if (IsName("else")) {
        ++pos_;
        other = ParseExpression();
      }
      ExprPtr c = Make(Expr::kCond);
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(other));  // null: undefined
      return c;
    }
    return e;
  }

 private:
  ExprPtr Binary(Expr::Type type, ExprPtr a, ExprPtr b, std::string op = "") {
    ExprPtr e = Make(type);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      ++pos_;
      e = Binary(Expr::kOr, std::move(e), ParseAnd());
    }
    return e;
  }
  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      ++pos_;
      e = Binary(Expr::kAnd, std::move(e), ParseNot());
    }
    return e;
  }
  ExprPtr ParseNot() {
    const NestingGuard guard(&depth_, cur().line);
    if (IsName("not")) {
      ExprPtr e = Make(Expr::kNot);
      ++pos_;
      e->kids.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    ExprPtr first = ParseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++pos_;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (IsName("not") && t_[pos_ + 1].type == Tok::kName && t_[pos_ + 1].text == "in") {
        op = "not in";
        pos_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::kCompare);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(ParseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = t_[pos_++].text;
      e = Binary(Expr::kBinary, std::move(e), ParseConcat(), op);
    }
    return e;
  }
  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    if (!IsOp("~")) return e;
    ExprPtr c = Make(Expr::kConcat);
    c->kids.push_back(std::move(e));
    while (IsOp("~")) {
      ++pos_;
      c->kids.push_back(ParseMath2());
    }
    return c;
  }
  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = t_[pos_++].text;
      e = Binary(Expr::kBinary, std::move(e), ParsePow(), op);
    }
    return e;
  }
  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      ++pos_;
      e = Binary(Expr::kBinary, std::move(e), ParseUnary(true), "**");
    }
    return e;
  }
  ExprPtr ParseUnary(bool with_filter) {
    const NestingGuard guard(&depth_, cur().line);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(IsOp("-") ? Expr::kNeg : Expr::kPos);
      ++pos_;
      e->kids.push_back(ParseUnary(false));
    } else {
      e = ParsePrimary();
    }
    e = ParsePostfix(std::move(e));
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        ++pos_;
        if (t.text == "true" || t.text == "True") return Const(Value::Bool(true), t.line);
        if (t.text == "false" || t.text == "False") return Const(Value::Bool(false), t.line);
        if (t.text == "none" || t.text == "None") return Const(Value::None(), t.line);
        ExprPtr e = Make(Expr::kName);
        e->line = t.line;
        e->name = t.text;
        return e;
      }
      case Tok::kString: {
        std::string s;
        while (cur().type == Tok::kString) s += t_[pos_++].text;  // adjacent literals join
        return Const(Value::Str(std::move(s)), t.line);
      }
      case Tok::kInt: ++pos_; return Const(Value::Int(t.i), t.line);
      case Tok::kFloat: ++pos_; return Const(Value::Float(t.f), t.line);
      case Tok::kOp:
        if (t.text == "(") {
          ++pos_;
          if (IsOp(")")) {
            ++pos_;
            return Make(Expr::kTuple);
          }
          ExprPtr e = ParseExpression();
          if (IsOp(",")) {
            ExprPtr tuple = Make(Expr::kTuple);
            tuple->kids.push_back(std::move(e));
            while (IsOp(",")) {
              ++pos_;
              if (IsOp(")")) break;
              tuple->kids.push_back(ParseExpression());
            }
            e = std::move(tuple);
          }
          Expect(")");
          return e;
        }
        if (t.text == "[") {
          ++pos_;
          ExprPtr e = Make(Expr::kList);
          while (!IsOp("]")) {
            e->kids.push_back(ParseExpression());
            if (!IsOp(",")) break;
            ++pos_;
          }
          Expect("]");
          return e;
        }
        if (t.text == "{") {
          ++pos_;
          ExprPtr e = Make(Expr::kDict);
          while (!IsOp("}")) {
            e->kids.push_back(ParseExpression());
            Expect(":");
            e->kids.push_back(ParseExpression());
            if (!IsOp(",")) break;
            ++pos_;
          }
          Expect("}");
          return e;
        }
        Unexpected();
      default:
        Unexpected();
    }
  }

  ExprPtr Const(Value v, int line) {
    ExprPtr e = Make(Expr::kConst);
    e->line = line;
    e->value = std::move(v);
    return e;
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        ++pos_;
        ExprPtr a;
        if (cur().type == Tok::kInt) {  // foo.0 is foo[0]
          a = Make(Expr::kItem);
          a->kids.push_back(std::move(e));
          a->kids.push_back(Const(Value::Int(cur().i), cur().line));
          ++pos_;
        } else {
          a = Make(Expr::kAttr);
          a->name = ExpectName();
          a->kids.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (IsOp("[")) {
        ++pos_;
        e = ParseSubscript(std::move(e));
      } else if (IsOp("(")) {
        e = ParseCall(std::move(e), Expr::kCall, "");
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr obj) {
    ExprPtr parts[3];
    int colons = 0;
    bool any = false;
    while (!IsOp("]")) {
      if (IsOp(":")) {
        if (++colons > 2) Unexpected();
        ++pos_;
        continue;
      }
      if (parts[colons]) Unexpected();
      parts[colons] = ParseExpression();
      any = true;
    }
    ++pos_;
    if (colons == 0) {
      if (!any) Unexpected();
      ExprPtr e = Make(Expr::kItem);
      e->kids.push_back(std::move(obj));
      e->kids.push_back(std::move(parts[0]));
      return e;
    }
    ExprPtr e = Make(Expr::kSlice);
    e->kids.push_back(std::move(obj));
    for (ExprPtr& p : parts) e->kids.push_back(std::move(p));
    return e;
  }

  // "(args)" after a callee, filter or test; positional before keyword.
  ExprPtr ParseCall(ExprPtr obj, Expr::Type type, std::string name) {
    ExprPtr e = Make(type);
    e->name = std::move(name);
    e->kids.push_back(std::move(obj));
    Expect("(");
    while (!IsOp(")")) {
      if (cur().type == Tok::kName && t_[pos_ + 1].type == Tok::kOp && t_[pos_ + 1].text == "=") {
        e->kw_names.push_back(cur().text);
        pos_ += 2;
        e->kids.push_back(ParseExpression());
      } else {
        if (!e->kw_names.empty()) Fail(absl::StrCat("line ", cur().line, ": positional argument after keyword"));
        e->kids.push_back(ParseExpression());
      }
      if (!IsOp(",")) break;
      ++pos_;
    }
    Expect(")");
    return e;
  }

  ExprPtr ParseFilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        ++pos_;
        std::string name = ExpectName();
        while (IsOp(".")) {  // dotted filter names
          ++pos_;
          name += "." + ExpectName();
        }
        if (!Known(std::begin(kFilters), std::end(kFilters), name))
          Fail(absl::StrCat("line ", cur().line, ": no filter named '", name, "'"));
        if (IsOp("(")) {
          e = ParseCall(std::move(e), Expr::kFilter, name);
        } else {
          ExprPtr f = Make(Expr::kFilter);
          f->name = name;
          f->kids.push_back(std::move(e));
          e = std::move(f);
        }
      } else if (IsName("is")) {
        ++pos_;
        bool negate = false;
        if (IsName("not")) {
          negate = true;
          ++pos_;
        }
        std::string name;
        if (cur().type == Tok::kName) {
          name = ExpectName();
        } else if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                              cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
          name = t_[pos_++].text;
        } else {
          Unexpected();
        }
        if (!Known(std::begin(kTests), std::end(kTests), name))
          Fail(absl::StrCat("line ", cur().line, ": no test named '", name, "'"));
        ExprPtr test;
        if (IsOp("(")) {
          test = ParseCall(std::move(e), Expr::kTest, name);
        } else {
          test = Make(Expr::kTest);
          test->name = name;
          test->kids.push_back(std::move(e));
          const Token& next = cur();
          const bool starts_arg =
              next.type == Tok::kString || next.type == Tok::kInt || next.type == Tok::kFloat ||
              (next.type == Tok::kName && next.text != "else" && next.text != "or" && next.text != "and") ||
              (next.type == Tok::kOp && (next.text == "(" || next.text == "[" || next.text == "{"));
          if (starts_arg) test->kids.push_back(ParsePostfix(ParsePrimary()));
        }
        test->negate = negate;
        e = std::move(test);
      } else if (IsOp("(")) {
        e = ParseCall(std::move(e), Expr::kCall, "");
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t pos_;
  int depth_ = 0;
};

// Statements.
class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segs_(std::move(segments)) {}

  Body ParseAll() {
    std::string end_tag;
    Body body = ParseBody({}, &end_tag);
    return body;
  }

 private:
  // Nodes up to one of `ends` (a statement tag's first word); *end_tag gets it.
  Body ParseBody(const std::vector<std::string>& ends, std::string* end_tag) {
    Body body;
    while (i_ < segs_.size()) {
      Segment& s = segs_[i_];
      if (s.type == Segment::kText) {
        auto n = std::make_unique<Node>();
        n->type = Node::kText;
        n->text = std::move(s.text);
        body.push_back(std::move(n));
        ++i_;
        continue;
      }
      if (s.type == Segment::kExpr) {
        ExprParser p(s.tokens, 0);
        auto n = std::make_unique<Node>();
        n->type = Node::kOutput;
        n->line = s.line;
        n->expr = p.ParseTuple();
        if (!p.AtEnd()) p.Unexpected();
        body.push_back(std::move(n));
        ++i_;
        continue;
      }
      if (s.tokens[0].type != Tok::kName) Fail(absl::StrCat("line ", s.line, ": expected a tag name"));
      const std::string word = s.tokens[0].text;
      if (std::find(ends.begin(), ends.end(), word) != ends.end()) {
        *end_tag = word;
        return body;
      }
      body.push_back(ParseStatement(word));
    }
    if (!ends.empty()) Fail(absl::StrCat("unexpected end of template: missing '", ends.back(), "'"));
    return body;
  }

  std::unique_ptr<Node> ParseStatement(const std::string& word) {
    Segment& s = segs_[i_];
    const int line = s.line;
    const NestingGuard guard(&nesting_, line);
    ExprParser p(s.tokens, 1);
    auto n = std::make_unique<Node>();
    n->line = line;
    auto finish_tag = [&]() {
      if (!p.AtEnd()) p.Unexpected();
      ++i_;
    };
    // An end tag (else, endif, ...): nothing may follow its name.
    auto closing = [&]() {
      ExprParser c(segs_[i_].tokens, 1);
      if (!c.AtEnd()) c.Unexpected();
      ++i_;
    };
    std::string end;
    if (word == "if") {
      n->type = Node::kIf;
      n->conds.push_back(p.ParseTuple());
      finish_tag();
      while (true) {
        n->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end));
        if (end == "elif") {
          ExprParser c(segs_[i_].tokens, 1);
          n->conds.push_back(c.ParseTuple());
          if (!c.AtEnd()) c.Unexpected();
          ++i_;
        } else if (end == "else") {
          closing();
          n->bodies.push_back(ParseBody({"endif"}, &end));
          closing();
          break;
        } else {
          closing();
          break;
        }
      }
    } else if (word == "for") {
      n->type = Node::kFor;
      n->targets.push_back(p.ExpectName());
      while (p.IsOp(",")) {
        p.Expect(",");
        n->targets.push_back(p.ExpectName());
      }
      if (!p.IsName("in")) p.Unexpected();
      p.ExpectName();
      // The iterable: an expression without its own "if" (that is the filter).
      n->expr = p.ParseTuple(/*with_cond=*/false);
      if (p.IsName("if")) {
        p.ExpectName();
        n->conds.push_back(p.ParseExpression());
      }
      if (p.IsName("recursive")) Fail(absl::StrCat("line ", line, ": recursive loops are not supported"));
      finish_tag();
      ++loop_depth_;
      n->bodies.push_back(ParseBody({"else", "endfor"}, &end));
      --loop_depth_;
      if (end == "else") {
        closing();
        n->bodies.push_back(ParseBody({"endfor"}, &end));
      }
      closing();
    } else if (word == "set") {
      std::string first = p.ExpectName();
      n->targets.push_back(first);
      if (p.IsOp(".")) {
        p.Expect(".");
        n->targets.push_back(p.ExpectName());
        n->attr_target = true;
      } else {
        while (p.IsOp(",")) {
          p.Expect(",");
          n->targets.push_back(p.ExpectName());
        }
      }
      if (p.IsOp("=")) {
        p.Expect("=");
        n->type = Node::kSet;
        n->expr = p.ParseTuple();
        finish_tag();
      } else {
        if (n->targets.size() > 1 && !n->attr_target)
          Fail(absl::StrCat("line ", line, ": a block set takes one name"));
        n->type = Node::kSetBlock;
        finish_tag();
        n->bodies.push_back(ParseBody({"endset"}, &end));
        closing();
      }
    } else if (word == "macro") {
      n->type = Node::kMacro;
      n->macro_name = p.ExpectName();
      p.Expect("(");
      while (!p.IsOp(")")) {
        n->params.push_back(p.ExpectName());
        if (p.IsOp("=")) {
          p.Expect("=");
          n->defaults.push_back(p.ParseExpression());
        } else {
          n->defaults.push_back(nullptr);
        }
        if (!p.IsOp(",")) break;
        p.Expect(",");
      }
      p.Expect(")");
      finish_tag();
      n->bodies.push_back(ParseBody({"endmacro"}, &end));
      closing();
    } else if (word == "break" || word == "continue") {
      if (loop_depth_ == 0) Fail(absl::StrCat("line ", line, ": '", word, "' outside a loop"));
      n->type = word == "break" ? Node::kBreak : Node::kContinue;
      finish_tag();
    } else if (word == "generation") {
      // transformers' assistant-mask marker: rendered as its body.
      finish_tag();
      Body inner = ParseBody({"endgeneration"}, &end);
      closing();
      n->type = Node::kIf;
      n->conds.push_back(nullptr);  // always
      n->bodies.push_back(std::move(inner));
    } else {
      Fail(absl::StrCat("line ", line, ": unknown or unsupported tag '", word, "'"));
    }
    return n;
  }

  std::vector<Segment> segs_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
};


// ---------------------------------------------------------------------------
// Evaluation.

struct Frame {
  absl::flat_hash_map<std::string, Value> vars;
  Frame* parent = nullptr;
  const Value* Find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

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

// Python's slice.indices() and the slice itself.
Value SliceOf(const Value& obj, const Value& start, const Value& stop, const Value& step_v) {
  auto given = [](const Value& v) { return !v.is_undefined() && v.kind != Kind::kNone; };
  const int64_t step = given(step_v) ? AsInt(step_v) : 1;
  if (step == 0) Fail("slice step cannot be zero");
  std::vector<char32_t> cps;
  int64_t n;
  if (obj.kind == Kind::kString) {
    cps = CodePoints(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.kind == Kind::kList) {
    n = static_cast<int64_t>(obj.list->size());
  } else {
    if (obj.is_undefined()) FailUndefined(obj);
    Fail(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (!given(v)) return dflt;
    int64_t x = AsInt(v);
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t k = b; step > 0 ? k < e : k > e; k += step) idx.push_back(k);
  if (obj.kind == Kind::kString) {
    std::string out;
    for (int64_t k : idx) AppendUtf8(cps[k], &out);
    return Value::Str(std::move(out));
  }
  List out;
  for (int64_t k : idx) out.push_back((*obj.list)[k]);
  return Value::MakeList(std::move(out), obj.tuple);
}

std::vector<std::string> SplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  const std::vector<char32_t> cps = CodePoints(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end = i + 1;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    lines.push_back(FromCodePoints(cps.data() + start, cps.data() + (keepends ? end : i)));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) lines.push_back(FromCodePoints(cps.data() + start, cps.data() + cps.size()));
  return lines;
}

// str.split / str.rsplit.
Value Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List parts;
  if (sep.is_undefined() || sep.kind == Kind::kNone) {
    const std::vector<char32_t> cps = CodePoints(s);
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < cps.size();) {
      while (i < cps.size() && IsPySpace(cps[i])) ++i;
      if (i == cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !IsPySpace(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      // The unsplit remainder keeps its inner whitespace (and loses the outer).
      if (!from_right) {
        words[maxsplit].second = words.back().second;
        words.resize(maxsplit + 1);
      } else {
        const size_t first = words.size() - maxsplit - 1;
        words[first].first = words.front().first;
        words.erase(words.begin(), words.begin() + static_cast<long>(first));
      }
    }
    for (const auto& [b, e] : words) parts.push_back(Value::Str(FromCodePoints(cps.data() + b, cps.data() + e)));
    return Value::MakeList(std::move(parts));
  }
  if (sep.kind != Kind::kString) Fail("must be str or None");
  const std::string& d = sep.str();
  if (d.empty()) Fail("empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t pos = 0;
    int64_t splits = 0;
    while (maxsplit < 0 || splits < maxsplit) {
      const size_t hit = s.find(d, pos);
      if (hit == std::string::npos) break;
      pieces.push_back(s.substr(pos, hit - pos));
      pos = hit + d.size();
      ++splits;
    }
    pieces.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    int64_t splits = 0;
    std::vector<std::string> rev;
    while (maxsplit < 0 || splits < maxsplit) {
      if (end < d.size()) break;
      const size_t hit = s.rfind(d, end - d.size());
      if (hit == std::string::npos) break;
      rev.push_back(s.substr(hit + d.size(), end - hit - d.size()));
      end = hit;
      ++splits;
    }
    rev.push_back(s.substr(0, end));
    pieces.assign(rev.rbegin(), rev.rend());
  }
  for (std::string& p : pieces) parts.push_back(Value::Str(std::move(p)));
  return Value::MakeList(std::move(parts));
}

std::string Replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every code point and at the end.
    int64_t done = 0;
    size_t i = 0;
    while (i <= s.size()) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i == s.size()) break;
      const int len = CodePointAt(s, i).second;
      out.append(s, i, len);
      i += len;
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += repl;
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
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

Value UnsafeAttribute(const Value& obj, const std::string& name) {
  Value u = Value::Undefined(absl::StrCat("access to attribute '", name, "' of '", TypeName(obj),
                                          "' object is unsafe."));
  u.unsafe = true;
  return u;
}

bool IsMethod(const Value& obj, const std::string& name, bool* unsafe) {
  static const char* const kStr[] = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower",
      "title", "capitalize", "replace", "find", "rfind", "index", "rindex", "count", "join",
      "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "format",
      "center", "ljust", "rjust", "zfill", "swapcase"};
  static const char* const kDictSafe[] = {"items", "keys", "values", "get", "copy"};
  static const char* const kDictUnsafe[] = {"pop", "popitem", "setdefault", "update", "clear"};
  static const char* const kListSafe[] = {"index", "count", "copy"};
  static const char* const kListUnsafe[] = {"append", "extend", "insert", "pop", "remove",
                                            "reverse", "sort", "clear"};
  *unsafe = false;
  switch (obj.kind) {
    case Kind::kString: return Known(std::begin(kStr), std::end(kStr), name);
    case Kind::kDict:
      if (obj.ns) return false;
      *unsafe = Known(std::begin(kDictUnsafe), std::end(kDictUnsafe), name);
      return *unsafe || Known(std::begin(kDictSafe), std::end(kDictSafe), name);
    case Kind::kList:
      if (obj.tuple) return name == "index" || name == "count";
      *unsafe = Known(std::begin(kListUnsafe), std::end(kListUnsafe), name);
      return *unsafe || Known(std::begin(kListSafe), std::end(kListSafe), name);
    default: return false;
  }
}

class Interp {
 public:
  Interp(const ChatTemplate::Limits& limits, Frame* root) : limits_(limits), root_(root) {}

  std::string out;

  Flow Exec(const Body& body, Frame* frame) {
    for (const auto& node : body) {
      const Flow flow = ExecNode(*node, frame);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Value CallValue(const Value& fn, const Args& args) {
    if (fn.kind != Kind::kCallable) {
      if (fn.is_undefined()) FailUndefined(fn);
      Fail(absl::StrCat("'", TypeName(fn), "' object is not callable"));
    }
    Step();
    Depth depth(this);
    return fn.fn->call(*this, args);
  }

  Value CallMethod(const Value& obj, const std::string& name, const Args& a);
  Value Filter(const std::string& name, const Value& v, const Args& a);
  bool Test(const std::string& name, const Value& v, const Args& a);

  Value GetAttr(const Value& obj, const std::string& name) {
    bool unsafe = false;
    if (obj.is_undefined()) FailUndefined(obj);
    if (IsMethod(obj, name, &unsafe)) {
      if (unsafe) return UnsafeAttribute(obj, name);
      return BoundMethod(obj, name);
    }
    if (obj.kind == Kind::kDict) {
      if (const Value* v = obj.dict->Find(name)) return *v;
    }
    return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' has no attribute '", name, "'"));
  }

  Value GetItem(const Value& obj, const Value& key) {
    switch (obj.kind) {
      case Kind::kUndefined: FailUndefined(obj);
      case Kind::kList:
      case Kind::kString:
        if (key.kind == Kind::kInt || key.kind == Kind::kBool) {
          int64_t i = AsInt(key);
          if (obj.kind == Kind::kList) {
            const int64_t n = static_cast<int64_t>(obj.list->size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) return (*obj.list)[i];
          } else {
            const std::vector<char32_t> cps = CodePoints(obj.str());
            const int64_t n = static_cast<int64_t>(cps.size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) return Value::Str(FromCodePoints(&cps[i], &cps[i] + 1));
          }
        }
        break;
      case Kind::kDict:
        if (!obj.ns) {
          if (const Value* v = obj.dict->Find(key)) return *v;
        }
        break;
      default: break;
    }
    if (key.kind == Kind::kString) return GetAttr(obj, key.str());
    return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' has no element ", Repr(key)));
  }

  void Write(std::string_view s) {
    if (out.size() + s.size() > limits_.max_output_bytes)
      Fail(absl::StrCat("the output exceeds ", limits_.max_output_bytes, " bytes"));
    out.append(s);
  }

  void Step() {
    if (++steps_ > limits_.max_steps) Fail(absl::StrCat("the template ran over ", limits_.max_steps, " steps"));
  }

  struct Depth {
    explicit Depth(Interp* in) : in_(in) {
      if (++in_->depth_ > in_->limits_.max_depth)
        Fail(absl::StrCat("the template nests deeper than ", in_->limits_.max_depth));
    }
    ~Depth() { --in_->depth_; }
    Interp* in_;
  };

  Value Eval(const Expr& e, Frame* f);

 private:
  Value BoundMethod(const Value& obj, const std::string& name) {
    Value v;
    v.kind = Kind::kCallable;
    v.fn = std::make_shared<const Callable>(Callable{
        name, [obj, name](Interp& in, const Args& a) { return in.CallMethod(obj, name, a); }});
    return v;
  }

  Args EvalArgs(const Expr& e, size_t first, Frame* f) {
    Args a;
    const size_t n_kw = e.kw_names.size();
    const size_t n_pos = e.kids.size() - first - n_kw;
    for (size_t k = 0; k < n_pos; ++k) a.pos.push_back(Eval(*e.kids[first + k], f));
    for (size_t k = 0; k < n_kw; ++k) a.kw.emplace_back(e.kw_names[k], Eval(*e.kids[first + n_pos + k], f));
    return a;
  }

  Flow ExecNode(const Node& n, Frame* f);
  void Assign(const std::vector<std::string>& targets, const Value& v, Frame* f);
  // A set statement's target: its names, or "ns.attr" on a namespace().
  void Assign(const Node& set, const Value& v, Frame* f);
  Value Arith(const std::string& op, const Value& a, const Value& b);
  Value MakeMacro(const Node& n);

  const ChatTemplate::Limits& limits_;
  Frame* root_;
  long steps_ = 0;
  int depth_ = 0;
};

void Interp::Assign(const std::vector<std::string>& targets, const Value& v, Frame* f) {
  if (targets.size() == 1) {
    f->vars[targets[0]] = v;
    return;
  }
  const std::vector<Value> items = Iterate(v);
  if (items.size() != targets.size()) {
    Fail(absl::StrCat(items.size() < targets.size() ? "not enough" : "too many",
                      " values to unpack (expected ", targets.size(), ", got ", items.size(), ")"));
  }
  for (size_t k = 0; k < targets.size(); ++k) f->vars[targets[k]] = items[k];
}

void Interp::Assign(const Node& set, const Value& v, Frame* f) {
  if (!set.attr_target) {
    Assign(set.targets, v, f);
    return;
  }
  const Value* ns = f->Find(set.targets[0]);
  if (ns == nullptr || ns->kind != Kind::kDict || !ns->ns)
    Fail(absl::StrCat("line ", set.line, ": cannot assign attribute on non-namespace object"));
  ns->dict->Set(Value::Str(set.targets[1]), v);
}

Value Interp::MakeMacro(const Node& n) {
  Value v;
  v.kind = Kind::kCallable;
  Frame* root = root_;
  const Node* node = &n;
  v.fn = std::make_shared<const Callable>(Callable{n.macro_name, [node, root](Interp& in, const Args& a) {
    Frame frame;
    frame.parent = root;
    if (a.pos.size() > node->params.size())
      Fail(absl::StrCat("macro '", node->macro_name, "' takes not more than ", node->params.size(),
                        " argument(s)"));
    for (const auto& [k, _] : a.kw) {
      if (std::find(node->params.begin(), node->params.end(), k) == node->params.end())
        Fail(absl::StrCat("macro '", node->macro_name, "' takes no keyword argument '", k, "'"));
    }
    for (size_t p = 0; p < node->params.size(); ++p) {
      Value arg = a.Get(p, node->params[p]);
      if (arg.is_undefined() && p >= a.pos.size()) {
        bool by_kw = false;
        for (const auto& [k, _] : a.kw) by_kw |= k == node->params[p];
        if (!by_kw) {
          arg = node->defaults[p] ? in.Eval(*node->defaults[p], &frame)
                                  : Value::Undefined(absl::StrCat("'", node->params[p], "' is undefined"));
        }
      }
      frame.vars[node->params[p]] = arg;
    }
    std::string saved;
    saved.swap(in.out);
    in.Exec(node->bodies[0], &frame);
    saved.swap(in.out);
    return Value::Str(std::move(saved));
  }});
  return v;
}

Flow Interp::ExecNode(const Node& n, Frame* f) {
  Step();
  switch (n.type) {
    case Node::kText: Write(n.text); return Flow::kNormal;
    case Node::kOutput: {
      const Value v = Eval(*n.expr, f);
      Write(PyStr(v));
      return Flow::kNormal;
    }
    case Node::kIf:
      for (size_t b = 0; b < n.conds.size(); ++b) {
        if (n.conds[b] == nullptr || Truthy(Eval(*n.conds[b], f))) return Exec(n.bodies[b], f);
      }
      if (n.bodies.size() > n.conds.size()) return Exec(n.bodies.back(), f);
      return Flow::kNormal;
    case Node::kFor: {
      std::vector<Value> items = Iterate(Eval(*n.expr, f));
      if (!n.conds.empty()) {
        std::vector<Value> kept;
        for (Value& item : items) {
          Step();
          Frame probe;
          probe.parent = f;
          Assign(n.targets, item, &probe);
          if (Truthy(Eval(*n.conds[0], &probe))) kept.push_back(std::move(item));
        }
        items = std::move(kept);
      }
      if (items.empty()) {
        if (n.bodies.size() > 1) return Exec(n.bodies[1], f);
        return Flow::kNormal;
      }
      const int64_t length = static_cast<int64_t>(items.size());
      Value cycle;
      cycle.kind = Kind::kCallable;
      for (int64_t k = 0; k < length; ++k) {
        Step();
        Frame frame;
        frame.parent = f;
        Assign(n.targets, items[k], &frame);
        Value loop = Value::MakeDict();
        auto set = [&](const char* key, Value v) { loop.dict->items.emplace_back(Value::Str(key), std::move(v)); };
        set("index", Value::Int(k + 1));
        set("index0", Value::Int(k));
        set("revindex", Value::Int(length - k));
        set("revindex0", Value::Int(length - k - 1));
        set("first", Value::Bool(k == 0));
        set("last", Value::Bool(k == length - 1));
        set("length", Value::Int(length));
        set("depth", Value::Int(1));
        set("depth0", Value::Int(0));
        set("previtem", k > 0 ? items[k - 1] : Value::Undefined("there is no previous item"));
        set("nextitem", k + 1 < length ? items[k + 1] : Value::Undefined("there is no next item"));
        cycle.fn = std::make_shared<const Callable>(Callable{"cycle", [k](Interp&, const Args& a) {
          if (a.pos.empty()) Fail("no items for cycling given");
          return a.pos[static_cast<size_t>(k) % a.pos.size()];
        }});
        set("cycle", cycle);
        frame.vars["loop"] = std::move(loop);
        const Flow flow = Exec(n.bodies[0], &frame);
        if (flow == Flow::kBreak) break;
      }
      return Flow::kNormal;
    }
    case Node::kSet: {
      const Value v = Eval(*n.expr, f);
      Assign(n, v, f);
      return Flow::kNormal;
    }
    case Node::kSetBlock: {
      std::string saved;
      saved.swap(out);
      Exec(n.bodies[0], f);
      saved.swap(out);
      Assign(n, Value::Str(std::move(saved)), f);
      return Flow::kNormal;
    }
    case Node::kMacro: f->vars[n.macro_name] = MakeMacro(n); return Flow::kNormal;
    case Node::kBreak: return Flow::kBreak;
    case Node::kContinue: return Flow::kContinue;
  }
  return Flow::kNormal;
}

Value Interp::Arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  const bool ints = (a.kind == Kind::kInt || a.kind == Kind::kBool) && (b.kind == Kind::kInt || b.kind == Kind::kBool);
  const bool nums = a.is_number() && b.is_number();
  auto unsupported = [&]() -> Value {
    Fail(absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '", TypeName(b), "'"));
  };
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(AsInt(a), AsInt(b), &r)) Fail("integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(AsDouble(a) + AsDouble(b));
    if (a.kind == Kind::kString && b.kind == Kind::kString) {
      if (a.s->size() + b.s->size() > limits_.max_output_bytes) Fail("string too long");
      return Value::Str(a.str() + b.str());
    }
    if (a.kind == Kind::kList && b.kind == Kind::kList && a.tuple == b.tuple) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::MakeList(std::move(items), a.tuple);
    }
    if (a.kind == Kind::kString || b.kind == Kind::kString)
      Fail(absl::StrCat("can only concatenate str (not \"", TypeName(a.kind == Kind::kString ? b : a), "\") to str"));
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(AsInt(a), AsInt(b), &r)) Fail("integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(AsDouble(a) - AsDouble(b));
    return unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(AsInt(a), AsInt(b), &r)) Fail("integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(AsDouble(a) * AsDouble(b));
    const Value* seq = a.kind == Kind::kString || a.kind == Kind::kList ? &a : &b;
    const Value* times = seq == &a ? &b : &a;
    if ((seq->kind == Kind::kString || seq->kind == Kind::kList) &&
        (times->kind == Kind::kInt || times->kind == Kind::kBool)) {
      const int64_t n = std::max<int64_t>(AsInt(*times), 0);
      const size_t unit = seq->kind == Kind::kString ? seq->s->size() : seq->list->size() * 16;
      if (unit > 0 && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit) Fail("repetition too long");
      if (seq->kind == Kind::kString) {
        std::string r;
        for (int64_t k = 0; k < n; ++k) r += seq->str();
        return Value::Str(std::move(r));
      }
      List items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
      return Value::MakeList(std::move(items), seq->tuple);
    }
    return unsupported();
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (AsDouble(b) == 0) Fail("division by zero");
    return Value::Float(AsDouble(a) / AsDouble(b));
  }
  if (op == "//" || op == "%") {
    if (a.kind == Kind::kString && op == "%") Fail("printf-style string formatting is not supported");
    if (!nums) return unsupported();
    if (ints) {
      const int64_t x = AsInt(a), y = AsInt(b);
      if (y == 0) Fail("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) Fail("integer overflow");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::Int(op == "//" ? q : r);
    }
    const double x = AsDouble(a), y = AsDouble(b);
    if (y == 0) Fail("float division by zero");
    if (op == "//") return Value::Float(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::Float(r);
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (ints && AsInt(b) >= 0) {
      int64_t base = AsInt(a), exp = AsInt(b), r = 1;
      while (exp > 0) {
        if ((exp & 1) && __builtin_mul_overflow(r, base, &r)) Fail("integer overflow");
        exp >>= 1;
        if (exp > 0 && __builtin_mul_overflow(base, base, &base)) Fail("integer overflow");
      }
      return Value::Int(r);
    }
    return Value::Float(std::pow(AsDouble(a), AsDouble(b)));
  }
  Fail("unknown operator " + op);
}

Value Interp::Eval(const Expr& e, Frame* f) {
  Depth depth(this);
  switch (e.type) {
    case Expr::kConst: return e.value;
    case Expr::kName: {
      if (const Value* v = f->Find(e.name)) return *v;
      return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
    }
    case Expr::kList:
    case Expr::kTuple: {
      List items;
      for (const auto& k : e.kids) items.push_back(Eval(*k, f));
      return Value::MakeList(std::move(items), e.type == Expr::kTuple);
    }
    case Expr::kDict: {
      Value d = Value::MakeDict();
      for (size_t k = 0; k + 1 < e.kids.size(); k += 2) d.dict->Set(Eval(*e.kids[k], f), Eval(*e.kids[k + 1], f));
      return d;
    }
    case Expr::kAttr: return GetAttr(Eval(*e.kids[0], f), e.name);
    case Expr::kItem: return GetItem(Eval(*e.kids[0], f), Eval(*e.kids[1], f));
    case Expr::kSlice: {
      const Value obj = Eval(*e.kids[0], f);
      Value parts[3];
      for (int k = 0; k < 3; ++k)
        if (e.kids[k + 1]) parts[k] = Eval(*e.kids[k + 1], f);
      return SliceOf(obj, parts[0], parts[1], parts[2]);
    }
    case Expr::kCall: {
      const Expr& callee = *e.kids[0];
      if (callee.type == Expr::kAttr) {
        const Value obj = Eval(*callee.kids[0], f);
        bool unsafe = false;
        if (!obj.is_undefined() && IsMethod(obj, callee.name, &unsafe)) {
          if (unsafe) FailUndefined(UnsafeAttribute(obj, callee.name));
          Args a = EvalArgs(e, 1, f);
          Step();
          return CallMethod(obj, callee.name, a);
        }
        const Value fn = GetAttr(obj, callee.name);
        return CallValue(fn, EvalArgs(e, 1, f));
      }
      const Value fn = Eval(callee, f);
      return CallValue(fn, EvalArgs(e, 1, f));
    }
    case Expr::kFilter: {
      const Value v = Eval(*e.kids[0], f);
      Step();
      return Filter(e.name, v, EvalArgs(e, 1, f));
    }
    case Expr::kTest: {
      const Value v = Eval(*e.kids[0], f);
      const bool r = Test(e.name, v, EvalArgs(e, 1, f));
      return Value::Bool(r != e.negate);
    }
    case Expr::kNeg:
    case Expr::kPos: {
      const Value v = Eval(*e.kids[0], f);
      if (v.is_undefined()) FailUndefined(v);
      if (!v.is_number()) Fail(absl::StrCat("bad operand type for unary ", e.type == Expr::kNeg ? "-" : "+", ": '", TypeName(v), "'"));
      if (e.type == Expr::kPos) return v.kind == Kind::kBool ? Value::Int(AsInt(v)) : v;
      if (v.kind == Kind::kFloat) return Value::Float(-v.f);
      if (AsInt(v) == std::numeric_limits<int64_t>::min()) Fail("integer overflow");
      return Value::Int(-AsInt(v));
    }
    case Expr::kNot: return Value::Bool(!Truthy(Eval(*e.kids[0], f)));
    case Expr::kAnd: {
      Value a = Eval(*e.kids[0], f);
      return Truthy(a) ? Eval(*e.kids[1], f) : a;
    }
    case Expr::kOr: {
      Value a = Eval(*e.kids[0], f);
      return Truthy(a) ? a : Eval(*e.kids[1], f);
    }
    case Expr::kBinary: return Arith(e.name, Eval(*e.kids[0], f), Eval(*e.kids[1], f));
    case Expr::kCompare: {
      Value left = Eval(*e.kids[0], f);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = Eval(*e.kids[k + 1], f);
        const std::string& op = e.ops[k];
        bool r;
        if (op == "==") r = Equal(left, right);
        else if (op == "!=") r = !Equal(left, right);
        else if (op == "in") r = Contains(right, left);
        else if (op == "not in") r = !Contains(right, left);
        else {
          const int c = Compare(left, right);
          r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
        }
        if (!r) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case Expr::kCond:
      if (Truthy(Eval(*e.kids[0], f))) return Eval(*e.kids[1], f);
      return e.kids[2] ? Eval(*e.kids[2], f) : Value::Undefined("the conditional expression's else is undefined");
    case Expr::kConcat: {
      std::string s;
      for (const auto& k : e.kids) {
        const Value v = Eval(*k, f);
        s += PyStr(v);
        if (s.size() > limits_.max_output_bytes) Fail("string too long");
      }
      return Value::Str(std::move(s));
    }
  }
  Fail("unknown expression");
}

std::string Pad(const std::string& s, int64_t width, const Value& fill_v, int side) {
  const std::string fill = fill_v.kind == Kind::kString ? fill_v.str() : " ";
  if (fill_v.kind == Kind::kString && CodePointCount(fill) != 1)
    Fail("The fill character must be exactly one character long");
  const int64_t n = static_cast<int64_t>(CodePointCount(s));
  if (width <= n) return s;
  if (width > (1 << 24)) Fail("width too large");
  const int64_t total = width - n;
  int64_t left = side < 0 ? 0 : side > 0 ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < total - left; ++k) out += fill;
  return out;
}

bool AllCodePoints(const std::string& s, const std::function<bool(char32_t)>& pred) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = CodePointAt(s, i);
    if (!pred(cp)) return false;
    i += len;
  }
  return true;
}

bool IsAlpha(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool IsDigit(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || (cat == UTF8PROC_CATEGORY_NO && c >= 0xB2 && c <= 0x2089);
}
bool IsAlnum(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return IsAlpha(c) || cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

// str.islower / str.isupper: some cased character, and none of the other case.
bool HasCase(const std::string& s, bool lower) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = CodePointAt(s, i);
    i += len;
    const bool is_upper = utf8proc_tolower(cp) != static_cast<utf8proc_int32_t>(cp);
    const bool is_lower = utf8proc_toupper(cp) != static_cast<utf8proc_int32_t>(cp);
    if (lower ? is_upper : is_lower) return false;
    cased |= lower ? is_lower : is_upper;
  }
  return cased;
}

// str.format with {} / {0} / {name} fields (no format specs).
std::string Format(const std::string& fmt, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos) Fail("Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, close - i - 1);
      Value v;
      if (field.empty()) {
        if (auto_index >= a.pos.size()) Fail("Replacement index out of range for positional args tuple");
        v = a.pos[auto_index++];
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
        const size_t k = std::stoul(field);
        if (k >= a.pos.size()) Fail("Replacement index out of range for positional args tuple");
        v = a.pos[k];
      } else if (std::all_of(field.begin(), field.end(), IsNameChar)) {
        bool found = false;
        for (const auto& [name, value] : a.kw) {
          if (name == field) {
            v = value;
            found = true;
          }
        }
        if (!found) Fail("KeyError: '" + field + "'");
      } else {
        Fail("format fields other than {}, {n} and {name} are not supported");
      }
      out += PyStr(v);
      i = close;
    } else if (c == '}') {
      Fail("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

Value Interp::CallMethod(const Value& obj, const std::string& name, const Args& a) {
  if (obj.kind == Kind::kString) {
    const std::string& s = obj.str();
    if (name == "strip") return Value::Str(Strip(s, a.Get(0, "chars"), true, true));
    if (name == "lstrip") return Value::Str(Strip(s, a.Get(0, "chars"), true, false));
    if (name == "rstrip") return Value::Str(Strip(s, a.Get(0, "chars"), false, true));
    if (name == "split" || name == "rsplit") {
      const Value max = a.Get(1, "maxsplit");
      return Split(s, a.Get(0, "sep"), max.is_undefined() ? -1 : AsInt(max), name == "rsplit");
    }
    if (name == "startswith" || name == "endswith") {
      const Value arg = a.Get(0, "prefix");
      std::vector<Value> options = arg.kind == Kind::kList && arg.tuple ? *arg.list : std::vector<Value>{arg};
      for (const Value& o : options) {
        if (o.kind != Kind::kString)
          Fail(absl::StrCat(name, " first arg must be str or a tuple of str, not ", TypeName(o)));
        const std::string& p = o.str();
        if (p.size() <= s.size() &&
            (name == "startswith" ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0))
          return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    if (name == "upper") return Value::Str(MapCase(s, true));
    if (name == "lower") return Value::Str(MapCase(s, false));
    if (name == "title") return Value::Str(Title(s));
    if (name == "capitalize") return Value::Str(Capitalize(s));
    if (name == "swapcase") {
      std::string out;
      for (size_t i = 0; i < s.size();) {
        const auto [cp, len] = CodePointAt(s, i);
        const auto up = utf8proc_toupper(cp);
        AppendUtf8(static_cast<char32_t>(up != static_cast<utf8proc_int32_t>(cp) ? up : utf8proc_tolower(cp)), &out);
        i += len;
      }
      return Value::Str(std::move(out));
    }
    if (name == "replace") {
      const Value old = a.Get(0, "old"), repl = a.Get(1, "new"), count = a.Get(2, "count");
      if (old.kind != Kind::kString || repl.kind != Kind::kString) Fail("replace arguments must be str");
      return Value::Str(Replace(s, old.str(), repl.str(), count.is_undefined() ? -1 : AsInt(count)));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
      const Value sub = a.Get(0, "sub");
      if (sub.kind != Kind::kString) Fail(absl::StrCat("must be str, not ", TypeName(sub)));
      if (a.pos.size() > 1) Fail(absl::StrCat("str.", name, " with start/end is not supported"));
      if (name == "count") {
        if (sub.s->empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s)) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub.str()); p != std::string::npos; p = s.find(sub.str(), p + sub.s->size())) ++n;
        return Value::Int(n);
      }
      const size_t hit = name[0] == 'r' ? s.rfind(sub.str()) : s.find(sub.str());
      if (hit == std::string::npos) {
        if (name == "index" || name == "rindex") Fail("substring not found");
        return Value::Int(-1);
      }
      return Value::Int(static_cast<int64_t>(CodePointCount(std::string_view(s).substr(0, hit))));
    }
    if (name == "join") {
      std::string out;
      bool first = true;
      for (const Value& v : Iterate(a.Get(0, "iterable"))) {
        if (v.kind != Kind::kString) Fail(absl::StrCat("sequence item: expected str instance, ", TypeName(v), " found"));
        if (!first) out += s;
        out += v.str();
        first = false;
        if (out.size() > limits_.max_output_bytes) Fail("string too long");
      }
      return Value::Str(std::move(out));
    }
    if (name == "splitlines") {
      List lines;
      for (std::string& l : SplitLines(s, Truthy(a.Get(0, "keepends")))) lines.push_back(Value::Str(std::move(l)));
      return Value::MakeList(std::move(lines));
    }
    if (name == "isdigit") return Value::Bool(AllCodePoints(s, IsDigit));
    if (name == "isalpha") return Value::Bool(AllCodePoints(s, IsAlpha));
    if (name == "isalnum") return Value::Bool(AllCodePoints(s, IsAlnum));
    if (name == "isspace") return Value::Bool(AllCodePoints(s, IsPySpace));
    if (name == "islower") return Value::Bool(HasCase(s, true));
    if (name == "isupper") return Value::Bool(HasCase(s, false));
    if (name == "format") return Value::Str(Format(s, a));
    if (name == "center" || name == "ljust" || name == "rjust") {
      return Value::Str(Pad(s, AsInt(a.Get(0, "width")), a.Get(1, "fillchar"),
                            name == "center" ? 0 : name == "ljust" ? -1 : 1));
    }
    if (name == "zfill") {
      const int64_t width = AsInt(a.Get(0, "width"));
      const int64_t n = static_cast<int64_t>(CodePointCount(s));
      if (width <= n) return obj;
      if (width > (1 << 24)) Fail("width too large");
      const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
      return Value::Str(s.substr(0, sign) + std::string(width - n, '0') + s.substr(sign));
    }
  } else if (obj.kind == Kind::kDict) {
    if (name == "items") {
      List items;
      for (const auto& [k, v] : obj.dict->items) items.push_back(Value::MakeList({k, v}, true));
      return Value::MakeList(std::move(items));
    }
    if (name == "keys" || name == "values") {
      List items;
      for (const auto& [k, v] : obj.dict->items) items.push_back(name == "keys" ? k : v);
      return Value::MakeList(std::move(items));
    }
    if (name == "get") {
      if (a.pos.empty()) Fail("get expected at least 1 argument, got 0");
      if (const Value* v = obj.dict->Find(a.pos[0])) return *v;
      return a.pos.size() > 1 ? a.pos[1] : Value::None();
    }
    if (name == "copy") {
      Value d = Value::MakeDict();
      d.dict->items = obj.dict->items;
      return d;
    }
  } else if (obj.kind == Kind::kList) {
    if (name == "index") {
      for (size_t k = 0; k < obj.list->size(); ++k)
        if (Equal((*obj.list)[k], a.Get(0, "value"))) return Value::Int(static_cast<int64_t>(k));
      Fail(absl::StrCat(Repr(a.Get(0, "value")), " is not in list"));
    }
    if (name == "count") {
      int64_t n = 0;
      for (const Value& v : *obj.list) n += Equal(v, a.Get(0, "value"));
      return Value::Int(n);
    }
    if (name == "copy") return Value::MakeList(*obj.list);
  }
  Fail(absl::StrCat("'", TypeName(obj), "' object has no method '", name, "'"));
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
    if (!Known(std::begin(kFilters), std::end(kFilters), filter)) Fail("No filter named '" + filter + "'");
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
      if (!Known(std::begin(kTests), std::end(kTests), test)) Fail("No test named '" + test + "'");
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
  if (name == "filter") return v.kind == Kind::kString && Known(std::begin(kFilters), std::end(kFilters), v.str());
  if (name == "test") return v.kind == Kind::kString && Known(std::begin(kTests), std::end(kTests), v.str());
  Fail("No test named '" + name + "'");
}

Value MakeCallable(std::string name, std::function<Value(Interp&, const Args&)> fn) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

// jinja2's globals, the sandbox's bounded range, and transformers' two.
void AddGlobals(Frame* globals) {
  globals->vars["range"] = MakeCallable("range", [](Interp&, const Args& a) {
    if (a.pos.empty() || a.pos.size() > 3) Fail("range expected 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = AsInt(a.pos[0]);
    } else {
      start = AsInt(a.pos[0]);
      stop = AsInt(a.pos[1]);
      if (a.pos.size() == 3) step = AsInt(a.pos[2]);
    }
    if (step == 0) Fail("range() arg 3 must not be zero");
    const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - start) / step));
    if (count > 100000) Fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    List items;
    for (int64_t x = start; step > 0 ? x < stop : x > stop; x += step) items.push_back(Value::Int(x));
    return Value::MakeList(std::move(items));
  });
  globals->vars["dict"] = MakeCallable("dict", [](Interp&, const Args& a) {
    Value d = Value::MakeDict();
    if (!a.pos.empty()) {
      if (a.pos.size() > 1 || a.pos[0].kind != Kind::kDict) Fail("dict() takes a mapping and keywords");
      d.dict->items = a.pos[0].dict->items;
    }
    for (const auto& [k, v] : a.kw) d.dict->Set(Value::Str(k), v);
    return d;
  });
  globals->vars["namespace"] = MakeCallable("namespace", [](Interp&, const Args& a) {
    Value ns = Value::MakeDict();
    ns.ns = true;
    for (const Value& p : a.pos) {
      if (p.kind != Kind::kDict) Fail("namespace() takes mappings and keywords");
      for (const auto& [k, v] : p.dict->items) ns.dict->Set(k, v);
    }
    for (const auto& [k, v] : a.kw) ns.dict->Set(Value::Str(k), v);
    return ns;
  });
  globals->vars["raise_exception"] = MakeCallable("raise_exception", [](Interp&, const Args& a) -> Value {
    throw Error{a.pos.empty() ? std::string() : PyStr(a.pos[0]), true};
  });
  globals->vars["strftime_now"] = MakeCallable("strftime_now", [](Interp&, const Args& a) {
    const Value fmt = a.Get(0, "format");
    if (fmt.kind != Kind::kString) Fail("strftime_now takes a format string");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, fmt.str().c_str(), &local);
    return Value::Str(std::string(buf, n));
  });
}

}  // namespace
}  // namespace jinja

namespace {
constexpr char kRaisedPayload[] = "chunkattn.chat_template.raised";
}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  // The engine walks code points; a file from outside may hold any bytes.
  if (!IsValidUtf8(source)) return absl::InvalidArgumentError("chat template: not valid UTF-8");
  try {
    jinja::Lexer lexer{std::string(source)};
    jinja::Parser parser(lexer.Run());
    auto program = std::make_shared<jinja::Program>();
    program->body = parser.ParseAll();
    return ChatTemplate(std::move(program));
  } catch (const jinja::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.message));
  }
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                                 const Limits& limits) const {
  if (!context.is_object()) return absl::InvalidArgumentError("chat template: the context must be a JSON object");
  try {
    jinja::Frame globals;
    jinja::AddGlobals(&globals);
    jinja::Frame root;
    root.parent = &globals;
    for (auto it = context.begin(); it != context.end(); ++it) root.vars[it.key()] = jinja::FromJson(it.value());
    jinja::Interp interp(limits, &root);
    interp.Exec(program_->body, &root);
    return std::move(interp.out);
  } catch (const jinja::Error& e) {
    absl::Status status = absl::InvalidArgumentError(e.raised ? e.message : absl::StrCat("chat template: ", e.message));
    if (e.raised) status.SetPayload(kRaisedPayload, absl::Cord("1"));
    return status;
  }
}

bool ChatTemplate::IsRaisedByTemplate(const absl::Status& status) {
  return status.GetPayload(kRaisedPayload).has_value();
}

absl::StatusOr<std::string> ModelChatTemplate::Apply(const nlohmann::ordered_json& messages,
                                                     const nlohmann::ordered_json& tools,
                                                     bool add_generation_prompt,
                                                     const nlohmann::ordered_json& extra,
                                                     const ChatTemplate::Limits& limits) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a list");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it) context[it.key()] = it.value();
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  }
  context["messages"] = messages;
  context["tools"] = tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  return (tool_use_template && !tools.is_null() ? *tool_use_template : chat_template).Render(context, limits);
}

namespace {

// base's reader; a read that fails midway is a bad input file, as documented.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (absl::IsDataLoss(text.status())) return absl::InvalidArgumentError(text.status().message());
  return text;
}

}  // namespace

absl::StatusOr<ModelChatTemplate> LoadChatTemplateFiles(const std::string& tokenizer_config_path,
                                                        const std::string& template_path) {
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (!tokenizer_config_path.empty()) {
    absl::StatusOr<std::string> text = ReadFile(tokenizer_config_path);
    if (!text.ok() && !(text.status().code() == absl::StatusCode::kNotFound && !template_path.empty()))
      return text.status();
    if (text.ok()) {
      config = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (config.is_discarded() || !config.is_object())
        return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path, ": not a JSON object"));
    }
  }
  // The template: the file, the config's string, or its named list's
  // "default" (and "tool_use", which transformers takes when tools are given).
  std::string source, tool_use_source;
  std::string origin = template_path.empty() ? tokenizer_config_path : template_path;
  if (!template_path.empty()) {
    absl::StatusOr<std::string> text = ReadFile(template_path);
    if (!text.ok()) return text.status();
    source = std::move(*text);
  } else {
    const auto it = config.find("chat_template");
    if (it == config.end() || it->is_null())
      return absl::NotFoundError(absl::StrCat(tokenizer_config_path, " has no chat_template"));
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      bool found = false;
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string())
          return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path,
                                                         ": chat_template entries must be {name, template}"));
        if (entry["name"] == "default") {
          source = entry["template"].get<std::string>();
          found = true;
        } else if (entry["name"] == "tool_use") {
          tool_use_source = entry["template"].get<std::string>();
        }
      }
      if (!found)
        return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path, ": chat_template has no \"default\" entry"));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path, ": chat_template must be a string or a list"));
    }
  }
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", parsed.status().message()));
  ModelChatTemplate out{std::move(*parsed), std::nullopt, nlohmann::ordered_json::object()};
  if (!tool_use_source.empty()) {
    absl::StatusOr<ChatTemplate> tool_use = ChatTemplate::Parse(tool_use_source);
    if (!tool_use.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, " (tool_use): ", tool_use.status().message()));
    out.tool_use_template = std::move(*tool_use);
  }
  // transformers' special_tokens_map: the named tokens that are set, the
  // additional ones, and extra_special_tokens' entries (Gemma 3's image tokens).
  auto token_text = [](const nlohmann::ordered_json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return "";
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (config.contains(key) && !token_text(config[key]).empty()) out.special_tokens[key] = token_text(config[key]);
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& v : config["additional_special_tokens"]) {
      if (v.is_string() || (v.is_object() && v.contains("content") && v["content"].is_string())) list.push_back(token_text(v));
    }
    if (!list.empty()) out.special_tokens["additional_special_tokens"] = list;
  }
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object()) {
    const auto& extra = config["extra_special_tokens"];
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (!token_text(it.value()).empty()) out.special_tokens[it.key()] = token_text(it.value());
    }
  }
  return out;
}

absl::StatusOr<ModelChatTemplate> LoadChatTemplate(const std::string& model_dir) {
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  const std::string config_path = model_dir + "/tokenizer_config.json";
  std::error_code ec;
  return LoadChatTemplateFiles(config_path, std::filesystem::exists(jinja_path, ec) ? jinja_path : "");
}

}  // namespace chunkattn
