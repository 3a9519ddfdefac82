#include "text/grammar/regex.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "text/utf8.h"

namespace chunkattn::grammar {
namespace {

using Ranges = std::vector<CodepointRange>;

const Ranges& DigitRanges() { static const Ranges r = {{'0', '9'}}; return r; }
const Ranges& WordRanges() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& SpaceRanges() { static const Ranges r = {{'\t', '\r'}, {' ', ' '}}; return r; }

class RegexParser {
 public:
  RegexParser(Grammar* g, std::string_view pattern, const RegexOptions& options, const Limits& limits)
      : g_(g), re_(pattern), options_(options), limits_(limits) {}

  absl::StatusOr<Grammar::ExprId> Parse() {
    if (static_cast<int64_t>(re_.size()) > limits_.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat("regex too long: %d bytes (limit %d)",
                                                        re_.size(), limits_.max_input_bytes));
    }
    // Top level: anchors are allowed at the ends of each alternative.
    std::vector<Grammar::ExprId> alts;
    while (true) {
      bool start_anchor = false, end_anchor = false;
      if (pos_ < re_.size() && re_[pos_] == '^') {
        start_anchor = true;
        ++pos_;
      }
      ASSIGN_OR_RETURN(Grammar::ExprId seq, ParseSequence(0, &end_anchor));
      if (!options_.full_match) {
        std::vector<Grammar::ExprId> parts;
        if (!start_anchor) parts.push_back(g_->Star(AnyChar()));
        parts.push_back(seq);
        if (!end_anchor) parts.push_back(g_->Star(AnyChar()));
        seq = g_->Seq(std::move(parts));
      }
      alts.push_back(seq);
      if (pos_ < re_.size() && re_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    if (pos_ < re_.size()) return Error(re_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return g_->Alt(std::move(alts));
  }

 private:
  absl::Status Error(const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrFormat("regex at offset %d: %s", pos_, why));
  }

  Grammar::ExprId AnyChar() { return MakeClass(Ranges{{'\n', '\n'}}, /*negated=*/true); }

  Grammar::ExprId MakeClass(Ranges ranges, bool negated) {
    Ranges norm = NormalizeRanges(std::move(ranges), negated);
    if (options_.json_string) return JsonStringClass(g_, norm);
    return g_->Class(std::move(norm));
  }

  // Alternatives inside a group.
  absl::StatusOr<Grammar::ExprId> ParseAlternatives(int depth) {
    if (depth > limits_.max_nesting_depth) {
      return Error(absl::StrFormat("groups nested deeper than %d", limits_.max_nesting_depth));
    }
    std::vector<Grammar::ExprId> alts;
    while (true) {
      ASSIGN_OR_RETURN(Grammar::ExprId seq, ParseSequence(depth, nullptr));
      alts.push_back(seq);
      if (pos_ < re_.size() && re_[pos_] == '|') {
        ++pos_;
        continue;
      }
      return g_->Alt(std::move(alts));
    }
  }

  // A sequence up to '|', ')' or the end. `end_anchor` is non-null at the
  // top level, where a final '$' is allowed.
  absl::StatusOr<Grammar::ExprId> ParseSequence(int depth, bool* end_anchor) {
    std::vector<Grammar::ExprId> items;
    while (pos_ < re_.size()) {
      const char c = re_[pos_];
      if (c == '|' || c == ')') break;
      if (c == '$') {
        const bool at_end = pos_ + 1 == re_.size() || re_[pos_ + 1] == '|';
        if (end_anchor == nullptr || !at_end) return Error("'$' is supported only at the end of the regex");
        *end_anchor = true;
        ++pos_;
        break;
      }
      if (c == '^') return Error("'^' is supported only at the start of the regex");
      ASSIGN_OR_RETURN(Grammar::ExprId atom, ParseAtom(depth));
      ASSIGN_OR_RETURN(atom, ParseQuantifiers(atom));
      items.push_back(atom);
      if (g_->num_exprs() > limits_.max_exprs) {
        return Error(absl::StrFormat("regex too large: over %d expressions", limits_.max_exprs));
      }
    }
    return g_->Seq(std::move(items));
  }

  absl::StatusOr<Grammar::ExprId> ParseAtom(int depth) {
    const char c = re_[pos_];
    if (c == '(') {
      ++pos_;
      if (pos_ < re_.size() && re_[pos_] == '?') {
        const std::string_view rest = re_.substr(pos_);
        if (rest.substr(0, 2) == "?:") {
          pos_ += 2;
        } else if (rest.substr(0, 3) == "?P<" || (rest.substr(0, 2) == "?<" && rest.size() > 2 &&
                                                 rest[2] != '=' && rest[2] != '!')) {
          const size_t close = re_.find('>', pos_);
          if (close == std::string_view::npos) return Error("unterminated group name");
          pos_ = close + 1;
        } else if (rest.substr(0, 2) == "?=" || rest.substr(0, 2) == "?!" || rest.substr(0, 3) == "?<=" ||
                   rest.substr(0, 3) == "?<!") {
          return Error("lookaround assertions are not supported");
        } else if (rest.substr(0, 3) == "?P=") {
          return Error("backreferences are not supported");
        } else {
          return Error("inline flags and special groups are not supported");
        }
      }
      ASSIGN_OR_RETURN(Grammar::ExprId inner, ParseAlternatives(depth + 1));
      if (pos_ >= re_.size() || re_[pos_] != ')') return Error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return AnyChar();
    }
    if (c == '*' || c == '+' || c == '?') return Error("quantifier with nothing to repeat");
    if (c == '{' && IsRepeatAt(pos_)) return Error("quantifier with nothing to repeat");
    if (c == '\\') {
      Ranges ranges;
      bool negated = false;
      uint32_t cp = 0;
      ASSIGN_OR_RETURN(bool is_class, ParseEscape(/*in_class=*/false, &cp, &ranges, &negated));
      if (is_class) return MakeClass(std::move(ranges), negated);
      return Char(cp);
    }
    ASSIGN_OR_RETURN(uint32_t cp, ParseUtf8());
    return Char(cp);
  }

  Grammar::ExprId Char(uint32_t cp) {
    if (options_.json_string) return JsonStringClass(g_, {{cp, cp}});
    std::string s;
    AppendUtf8(cp, &s);
    return g_->Literal(s);
  }

  absl::StatusOr<uint32_t> ParseUtf8() {
    uint32_t cp = 0;
    const int len = DecodeUtf8(re_, pos_, &cp);
    if (len == 0) return Error("invalid UTF-8");
    pos_ += len;
    return cp;
  }

  absl::StatusOr<uint32_t> ParseHex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      if (pos_ >= re_.size() || HexValue(re_[pos_]) < 0) return Error("bad hex escape");
      v = v * 16 + HexValue(re_[pos_++]);
    }
    return v;
  }

  // An escape at pos_ ('\'). Returns true with `ranges`/`negated` for a class
  // escape (\d ...), false with `cp` for one character.
  absl::StatusOr<bool> ParseEscape(bool in_class, uint32_t* cp, Ranges* ranges, bool* negated) {
    ++pos_;
    if (pos_ >= re_.size()) return Error("trailing backslash");
    const char e = re_[pos_++];
    switch (e) {
      case 'd': *ranges = DigitRanges(); *negated = false; return true;
      case 'D': *ranges = DigitRanges(); *negated = true; return true;
      case 'w': *ranges = WordRanges(); *negated = false; return true;
      case 'W': *ranges = WordRanges(); *negated = true; return true;
      case 's': *ranges = SpaceRanges(); *negated = false; return true;
      case 'S': *ranges = SpaceRanges(); *negated = true; return true;
      case 'n': *cp = '\n'; return false;
      case 'r': *cp = '\r'; return false;
      case 't': *cp = '\t'; return false;
      case 'f': *cp = '\f'; return false;
      case 'v': *cp = '\v'; return false;
      case '0': *cp = 0; return false;
      case 'x':
      case 'u': {
        if (pos_ < re_.size() && re_[pos_] == '{') {
          const size_t close = re_.find('}', pos_);
          if (close == std::string_view::npos || close == pos_ + 1 || close - pos_ - 1 > 6) {
            return Error(absl::StrFormat("bad \\%c{...} escape", e));
          }
          ++pos_;
          ASSIGN_OR_RETURN(*cp, ParseHex(close - pos_));
          ++pos_;
        } else {
          ASSIGN_OR_RETURN(*cp, ParseHex(e == 'x' ? 2 : 4));
        }
        if (*cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) {
          return Error("escape is not a Unicode scalar value");
        }
        return false;
      }
      case 'b':
        if (in_class) { *cp = '\b'; return false; }
        return Error("word boundaries (\\b) are not supported");
      case 'B': return Error("word boundaries (\\B) are not supported");
      case 'A': case 'z': case 'Z': case 'G':
        return Error(absl::StrFormat("anchor \\%c is not supported", e));
      case 'k': return Error("backreferences are not supported");
      case 'p': case 'P': return Error("Unicode property classes (\\p) are not supported");
      default: break;
    }
    if (e >= '1' && e <= '9') return Error("backreferences are not supported");
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
      return Error(absl::StrFormat("unknown escape \\%c", e));
    }
    --pos_;
    ASSIGN_OR_RETURN(*cp, ParseUtf8());
    return false;
  }

  absl::StatusOr<Grammar::ExprId> ParseClass() {
    ++pos_;  // [
    bool negated = false;
    if (pos_ < re_.size() && re_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    Ranges ranges;
    bool first = true;
    while (true) {
      if (pos_ >= re_.size()) return Error("unterminated character class");
      if (re_[pos_] == ']' && !first) {
        ++pos_;
        break;
      }
      if (re_.substr(pos_, 2) == "[:") return Error("POSIX classes ([:alpha:]) are not supported");
      first = false;
      uint32_t lo;
      if (re_[pos_] == '\\') {
        Ranges sub;
        bool sub_negated = false;
        ASSIGN_OR_RETURN(bool is_class, ParseEscape(/*in_class=*/true, &lo, &sub, &sub_negated));
        if (is_class) {
          for (const CodepointRange& r : NormalizeRanges(std::move(sub), sub_negated)) ranges.push_back(r);
          continue;
        }
      } else {
        ASSIGN_OR_RETURN(lo, ParseUtf8());
      }
      uint32_t hi = lo;
      if (pos_ + 1 < re_.size() && re_[pos_] == '-' && re_[pos_ + 1] != ']') {
        ++pos_;
        if (re_[pos_] == '\\') {
          Ranges sub;
          bool sub_negated = false;
          ASSIGN_OR_RETURN(bool is_class, ParseEscape(/*in_class=*/true, &hi, &sub, &sub_negated));
          if (is_class) return Error("a class escape cannot end a range");
        } else {
          ASSIGN_OR_RETURN(hi, ParseUtf8());
        }
        if (hi < lo) return Error("character range out of order");
      }
      ranges.push_back({lo, hi});
    }
    return MakeClass(std::move(ranges), negated);
  }

  // Whether a {m}, {m,} or {m,n} quantifier starts at `p` (else '{' is a literal,
  // as in PCRE2).
  bool IsRepeatAt(size_t p) const {
    if (p >= re_.size() || re_[p] != '{') return false;
    ++p;
    const size_t digits = p;
    while (p < re_.size() && re_[p] >= '0' && re_[p] <= '9') ++p;
    if (p == digits) return false;
    if (p < re_.size() && re_[p] == ',') {
      ++p;
      while (p < re_.size() && re_[p] >= '0' && re_[p] <= '9') ++p;
    }
    return p < re_.size() && re_[p] == '}';
  }

  absl::StatusOr<Grammar::ExprId> ParseQuantifiers(Grammar::ExprId atom) {
    while (pos_ < re_.size()) {
      const char c = re_[pos_];
      int64_t min, max;
      if (c == '*') {
        min = 0, max = Grammar::kUnbounded;
        ++pos_;
      } else if (c == '+') {
        min = 1, max = Grammar::kUnbounded;
        ++pos_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++pos_;
      } else if (c == '{' && IsRepeatAt(pos_)) {
        ++pos_;
        min = 0;
        while (re_[pos_] != ',' && re_[pos_] != '}') {
          min = min * 10 + (re_[pos_++] - '0');
          if (min > limits_.max_repeat) return Error(RepeatLimit());
        }
        max = min;
        if (re_[pos_] == ',') {
          ++pos_;
          if (re_[pos_] == '}') {
            max = Grammar::kUnbounded;
          } else {
            max = 0;
            while (re_[pos_] != '}') {
              max = max * 10 + (re_[pos_++] - '0');
              if (max > limits_.max_repeat) return Error(RepeatLimit());
            }
          }
        }
        ++pos_;  // }
        if (max != Grammar::kUnbounded && max < min) return Error("repetition {m,n} with n < m");
      } else {
        break;
      }
      if (pos_ < re_.size() && re_[pos_] == '?') {
        ++pos_;  // lazy: the same language
      } else if (pos_ < re_.size() && re_[pos_] == '+') {
        return Error("possessive quantifiers are not supported");
      }
      atom = g_->Repeat(atom, static_cast<int32_t>(min), static_cast<int32_t>(max));
    }
    return atom;
  }

  std::string RepeatLimit() const {
    return absl::StrFormat("repetition count exceeds the limit of %d", limits_.max_repeat);
  }

  Grammar* g_;
  std::string_view re_;
  const RegexOptions& options_;
  const Limits& limits_;
  size_t pos_ = 0;
};

void AppendJsonEscape(uint32_t cp, std::string* out) {
  switch (cp) {
    case '"': *out += "\\\""; return;
    case '\\': *out += "\\\\"; return;
    case '\b': *out += "\\b"; return;
    case '\f': *out += "\\f"; return;
    case '\n': *out += "\\n"; return;
    case '\r': *out += "\\r"; return;
    case '\t': *out += "\\t"; return;
    default: *out += absl::StrFormat("\\u%04x", cp);
  }
}

}  // namespace

Grammar::ExprId JsonStringClass(Grammar* g, const std::vector<CodepointRange>& ranges) {
  // Raw: everything but '"', '\' and U+0000..U+001F, which JSON must escape.
  Ranges raw, escaped;
  for (const CodepointRange& r : ranges) {
    for (uint32_t cp = r.lo; cp <= std::min<uint32_t>(r.hi, 0x1F); ++cp) escaped.push_back({cp, cp});
    uint32_t lo = std::max<uint32_t>(r.lo, 0x20);
    if (lo > r.hi) continue;
    for (uint32_t special : {uint32_t{'"'}, uint32_t{'\\'}}) {
      if (special >= lo && special <= r.hi) {
        escaped.push_back({special, special});
        if (special > lo) raw.push_back({lo, special - 1});
        lo = special + 1;
      }
    }
    if (lo <= r.hi) raw.push_back({lo, r.hi});
  }
  std::vector<Grammar::ExprId> alts;
  if (!raw.empty()) {
    Ranges norm = NormalizeRanges(std::move(raw), false);
    if (norm.size() == 1 && norm[0].lo == norm[0].hi) {
      std::string s;
      AppendUtf8(norm[0].lo, &s);
      alts.push_back(g->Literal(s));
    } else {
      alts.push_back(g->Class(std::move(norm)));
    }
  }
  for (const CodepointRange& r : escaped) {
    std::string s;
    AppendJsonEscape(r.lo, &s);
    alts.push_back(g->Literal(s));
  }
  return g->Alt(std::move(alts));
}

absl::StatusOr<Grammar::ExprId> AddRegex(Grammar* g, std::string_view pattern, const RegexOptions& options,
                                         const Limits& limits) {
  return RegexParser(g, pattern, options, limits).Parse();
}

absl::StatusOr<Grammar> RegexToGrammar(std::string_view pattern, const Limits& limits) {
  Grammar g;
  const Grammar::RuleId root = g.AddRule("root");
  ASSIGN_OR_RETURN(Grammar::ExprId body, AddRegex(&g, pattern, RegexOptions(), limits));
  g.SetBody(root, body);
  g.set_root(root);
  RETURN_IF_ERROR(g.Validate(limits));
  return g;
}

}  // namespace chunkattn::grammar
