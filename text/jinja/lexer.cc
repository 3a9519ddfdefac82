// The lexer: text and tags, and the tokens inside each tag, in one pass over
// the source (see lexer.h).
#include "text/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "text/jinja/py_str.h"
#include "text/jinja/value.h"
#include "text/utf8.h"

namespace chunkattn {
namespace jinja {

bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }

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

}  // namespace

std::vector<Segment> Lex(std::string source) { return Lexer(std::move(source)).Run(); }

}  // namespace jinja
}  // namespace chunkattn
