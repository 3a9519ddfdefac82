#include "text/grammar/gbnf.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "text/utf8.h"

namespace chunkattn::grammar {
namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  absl::StatusOr<Grammar> Parse() {
    if (static_cast<int64_t>(text_.size()) > limits_.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "grammar text too large: %d bytes (limit %d)", text_.size(), limits_.max_input_bytes));
    }
    SkipSpace();
    while (pos_ < text_.size()) {
      std::string name = ParseName();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") return Error(absl::StrCat("expected '::=' after '", name, "'"));
      pos_ += 3;
      const Grammar::RuleId id = RuleFor(name);
      if (defined_[id]) return Error(absl::StrCat("rule '", name, "' is defined twice"));
      defined_[id] = true;
      ASSIGN_OR_RETURN(Grammar::ExprId body, ParseAlternatives(0));
      g_.SetBody(id, body);
      SkipSpace();
      if (pos_ < text_.size() && !AtRuleStart()) return Error("unexpected character");
      if (g_.num_exprs() > limits_.max_exprs) {
        return absl::InvalidArgumentError(
            absl::StrFormat("grammar too large: over %d expressions", limits_.max_exprs));
      }
    }
    for (Grammar::RuleId r = 0; r < g_.num_rules(); ++r) {
      if (!defined_[r]) {
        return absl::InvalidArgumentError(
            absl::StrCat("grammar: rule '", g_.rule(r).name, "' is used but not defined"));
      }
    }
    const Grammar::RuleId root = g_.FindRule("root");
    if (root < 0) return absl::InvalidArgumentError("grammar: no rule named 'root'");
    g_.set_root(root);
    RETURN_IF_ERROR(g_.Validate(limits_));
    return std::move(g_);
  }

 private:
  absl::Status Error(const std::string& why) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(absl::StrFormat("grammar:%d:%d: %s", line, col, why));
  }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // Whether `name ::=` starts at pos_: the end of the current rule.
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < text_.size() && IsNameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  Grammar::RuleId RuleFor(const std::string& name) {
    auto it = rule_ids_.find(name);
    if (it != rule_ids_.end()) return it->second;
    const Grammar::RuleId id = g_.AddRule(name);
    rule_ids_[name] = id;
    defined_.push_back(false);
    return id;
  }

  absl::StatusOr<Grammar::ExprId> ParseAlternatives(int depth) {
    if (depth > limits_.max_nesting_depth) {
      return Error(absl::StrFormat("nesting deeper than %d", limits_.max_nesting_depth));
    }
    std::vector<Grammar::ExprId> alts;
    while (true) {
      ASSIGN_OR_RETURN(Grammar::ExprId seq, ParseSequence(depth));
      alts.push_back(seq);
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return g_.Alt(std::move(alts));
  }

  absl::StatusOr<Grammar::ExprId> ParseSequence(int depth) {
    std::vector<Grammar::ExprId> items;
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size()) break;
      const char c = text_[pos_];
      if (c == '|' || c == ')') break;
      if (IsNameChar(c) && AtRuleStart()) break;
      Grammar::ExprId atom;
      if (c == '"') {
        ASSIGN_OR_RETURN(atom, ParseString());
      } else if (c == '[') {
        ASSIGN_OR_RETURN(atom, ParseClass());
      } else if (c == '.') {
        ++pos_;
        atom = g_.Class({}, /*negated=*/true);
      } else if (c == '(') {
        ++pos_;
        ASSIGN_OR_RETURN(atom, ParseAlternatives(depth + 1));
        SkipSpace();
        if (pos_ >= text_.size() || text_[pos_] != ')') return Error("expected ')'");
        ++pos_;
      } else if (IsNameChar(c)) {
        atom = g_.Ref(RuleFor(ParseName()));
      } else {
        return Error(absl::StrFormat("unexpected character '%c'", c));
      }
      ASSIGN_OR_RETURN(atom, ParsePostfix(atom));
      items.push_back(atom);
    }
    return g_.Seq(std::move(items));
  }

  absl::StatusOr<Grammar::ExprId> ParsePostfix(Grammar::ExprId atom) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '*') {
        atom = g_.Star(atom);
      } else if (c == '+') {
        atom = g_.Plus(atom);
      } else if (c == '?') {
        atom = g_.Optional(atom);
      } else if (c == '{') {
        ++pos_;
        int64_t min = 0, max = Grammar::kUnbounded;
        SkipSpace();
        ASSIGN_OR_RETURN(bool has_min, ParseInt(&min));
        SkipSpace();
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          SkipSpace();
          ASSIGN_OR_RETURN(bool has_max, ParseInt(&max));
          if (!has_max) max = Grammar::kUnbounded;
        } else {
          if (!has_min) return Error("expected a number in {}");
          max = min;
        }
        SkipSpace();
        if (pos_ >= text_.size() || text_[pos_] != '}') return Error("expected '}'");
        if (max != Grammar::kUnbounded && max < min) return Error("repetition {m,n} with n < m");
        if (min > limits_.max_repeat || max > limits_.max_repeat) {
          return Error(absl::StrFormat("repetition count exceeds the limit of %d", limits_.max_repeat));
        }
        atom = g_.Repeat(atom, static_cast<int32_t>(min), static_cast<int32_t>(max));
      } else {
        break;
      }
      ++pos_;
    }
    return atom;
  }

  absl::StatusOr<bool> ParseInt(int64_t* out) {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + (text_[pos_] - '0');
      if (v > (int64_t{1} << 40)) return Error("repetition count too large");
      ++pos_;
    }
    if (pos_ == start) return false;
    *out = v;
    return true;
  }

  // One code point at pos_ (after an opening quote or bracket), decoding
  // escapes and UTF-8.
  absl::StatusOr<uint32_t> ParseChar() {
    if (pos_ >= text_.size()) return Error("unterminated literal");
    const uint8_t c = static_cast<uint8_t>(text_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= text_.size()) return Error("unterminated escape");
      const char e = text_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 'r': return uint32_t{'\r'};
        case 't': return uint32_t{'\t'};
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '.':
          return static_cast<uint32_t>(e);
        case 'x': return ParseHex(2);
        case 'u': return ParseHex(4);
        case 'U': return ParseHex(8);
        default: return Error(absl::StrFormat("unknown escape '\\%c'", e));
      }
    }
    uint32_t cp = 0;
    const int len = DecodeUtf8(text_, pos_, &cp);
    if (len == 0) return Error("invalid UTF-8");
    pos_ += len;
    return cp;
  }

  absl::StatusOr<uint32_t> ParseHex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= text_.size() || HexValue(text_[pos_]) < 0) return Error("bad hex escape");
      v = v * 16 + HexValue(text_[pos_++]);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return Error("escape is not a Unicode scalar value");
    return v;
  }

  absl::StatusOr<Grammar::ExprId> ParseString() {
    ++pos_;  // "
    std::string bytes;
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      if (text_[pos_] == '"') {
        ++pos_;
        break;
      }
      ASSIGN_OR_RETURN(uint32_t cp, ParseChar());
      AppendUtf8(cp, &bytes);
    }
    return g_.Literal(bytes);
  }

  absl::StatusOr<Grammar::ExprId> ParseClass() {
    ++pos_;  // [
    bool negated = false;
    if (pos_ < text_.size() && text_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<CodepointRange> ranges;
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated character class");
      if (text_[pos_] == ']') {
        ++pos_;
        break;
      }
      ASSIGN_OR_RETURN(uint32_t lo, ParseChar());
      uint32_t hi = lo;
      if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        ASSIGN_OR_RETURN(hi, ParseChar());
        if (hi < lo) return Error("character range out of order");
      }
      ranges.push_back({lo, hi});
    }
    return g_.Class(std::move(ranges), negated);
  }

  std::string_view text_;
  const Limits& limits_;
  size_t pos_ = 0;
  Grammar g_;
  absl::flat_hash_map<std::string, Grammar::RuleId> rule_ids_;
  std::vector<bool> defined_;
};

}  // namespace

absl::StatusOr<Grammar> ParseGbnf(std::string_view text, const Limits& limits) {
  return GbnfParser(text, limits).Parse();
}

}  // namespace chunkattn::grammar
