// The methods of str, dict and list that templates call (Interp::CallMethod),
// and which of them the sandbox allows.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "text/jinja/builtins.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/lexer.h"
#include "text/jinja/py_str.h"
#include "text/jinja/repr.h"
#include "text/utf8.h"
#include "utf8proc.h"

namespace chunkattn {
namespace jinja {

namespace {

// The str.isX() methods: not empty, and `pred` holds for every code point.
bool AllCodePoints(const std::string& s, const std::function<bool(char32_t)>& pred) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = CodePointAt(s, i);
    if (!pred(cp)) return false;
    i += len;
  }
  return true;
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

}  // namespace

bool Known(const char* const* begin, const char* const* end, const std::string& name) {
  return std::any_of(begin, end, [&](const char* n) { return name == n; });
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

}  // namespace jinja
}  // namespace chunkattn
