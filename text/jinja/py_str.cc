// Python's str operations, code point by code point (utf8proc for the Unicode
// character database).
#include "text/jinja/py_str.h"

#include <algorithm>
#include <utility>

#include "text/utf8.h"
#include "utf8proc.h"

namespace chunkattn {
namespace jinja {

namespace {

bool IsCased(char32_t c) {
  return utf8proc_toupper(c) != static_cast<utf8proc_int32_t>(c) ||
         utf8proc_tolower(c) != static_cast<utf8proc_int32_t>(c);
}

}  // namespace

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

bool IsPySpace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}

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

}  // namespace jinja
}  // namespace chunkattn
