// Python's str(), repr() and json.dumps over the engine's values.
#include "text/jinja/repr.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "text/utf8.h"
#include "utf8proc.h"

namespace chunkattn {
namespace jinja {

namespace {

// str.isprintable() of one character: what repr() writes as itself.
bool IsPrintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

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

}  // namespace

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

}  // namespace jinja
}  // namespace chunkattn
