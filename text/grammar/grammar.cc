#include "text/grammar/grammar.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "text/utf8.h"

namespace chunkattn::grammar {
namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

void AppendEscaped(uint32_t cp, bool in_class, std::string* out) {
  switch (cp) {
    case '\n': *out += "\\n"; return;
    case '\r': *out += "\\r"; return;
    case '\t': *out += "\\t"; return;
    case '\\': *out += "\\\\"; return;
    default: break;
  }
  if (!in_class && cp == '"') { *out += "\\\""; return; }
  if (in_class && (cp == ']' || cp == '^' || cp == '-' || cp == '[')) {
    out->push_back('\\');
    out->push_back(static_cast<char>(cp));
    return;
  }
  if (cp < 0x20 || cp == 0x7F) { *out += absl::StrFormat("\\x%02X", cp); return; }
  if (cp > 0xFFFF) { *out += absl::StrFormat("\\U%08X", cp); return; }
  if (cp >= 0x80 && cp < 0xA0) { *out += absl::StrFormat("\\u%04X", cp); return; }
  AppendUtf8(cp, out);
}

}  // namespace

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int DecodeUtf8(std::string_view s, size_t pos, uint32_t* cp) {
  const auto lead = static_cast<uint8_t>(s[pos]);
  const size_t len = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
  if (len == 0 || pos + len > s.size() || !IsValidUtf8(s.substr(pos, len))) return 0;
  *cp = CodePointAt(s, pos).first;
  return static_cast<int>(len);
}

std::vector<CodepointRange> NormalizeRanges(std::vector<CodepointRange> ranges, bool negated) {
  std::vector<CodepointRange> clipped;
  for (CodepointRange r : ranges) {
    if (r.lo > r.hi || r.lo > kMaxCodepoint) continue;
    r.hi = std::min(r.hi, kMaxCodepoint);
    // Surrogates are not scalar values: cut them out.
    if (r.lo < kSurrogateLo && r.hi > kSurrogateHi) {
      clipped.push_back({r.lo, kSurrogateLo - 1});
      clipped.push_back({kSurrogateHi + 1, r.hi});
    } else if (r.lo >= kSurrogateLo && r.hi <= kSurrogateHi) {
      continue;
    } else if (r.lo >= kSurrogateLo && r.lo <= kSurrogateHi) {
      clipped.push_back({kSurrogateHi + 1, r.hi});
    } else if (r.hi >= kSurrogateLo && r.hi <= kSurrogateHi) {
      clipped.push_back({r.lo, kSurrogateLo - 1});
    } else {
      clipped.push_back(r);
    }
  }
  std::sort(clipped.begin(), clipped.end(),
            [](const CodepointRange& a, const CodepointRange& b) { return a.lo < b.lo; });
  std::vector<CodepointRange> merged;
  for (const CodepointRange& r : clipped) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (!negated) return merged;
  std::vector<CodepointRange> out;
  uint32_t next = 0;
  for (const CodepointRange& r : merged) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  // The complement spans the surrogate gap: normalize again to cut it.
  return NormalizeRanges(std::move(out), false);
}

Grammar::ExprId Grammar::Add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

Grammar::ExprId Grammar::Empty() { return Add(Expr{}); }

Grammar::ExprId Grammar::Literal(std::string_view utf8) {
  if (utf8.empty()) return Empty();
  Expr e;
  e.kind = Kind::kLiteral;
  e.literal = std::string(utf8);
  return Add(std::move(e));
}

Grammar::ExprId Grammar::Class(std::vector<CodepointRange> ranges, bool negated) {
  Expr e;
  e.kind = Kind::kClass;
  e.ranges = NormalizeRanges(std::move(ranges), negated);
  return Add(std::move(e));
}

Grammar::ExprId Grammar::Ref(RuleId rule) {
  Expr e;
  e.kind = Kind::kRef;
  e.rule = rule;
  return Add(std::move(e));
}

Grammar::ExprId Grammar::Seq(std::vector<ExprId> items) {
  if (items.empty()) return Empty();
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Kind::kSeq;
  e.items = std::move(items);
  return Add(std::move(e));
}

Grammar::ExprId Grammar::Alt(std::vector<ExprId> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Kind::kAlt;  // no items: matches nothing
  e.items = std::move(items);
  return Add(std::move(e));
}

Grammar::ExprId Grammar::Repeat(ExprId item, int32_t min, int32_t max) {
  if (min == 1 && max == 1) return item;
  Expr e;
  e.kind = Kind::kRepeat;
  e.items = {item};
  e.min = min;
  e.max = max;
  return Add(std::move(e));
}

Grammar::RuleId Grammar::AddRule(std::string_view name) {
  std::string unique(name);
  for (int i = 2; FindRule(unique) >= 0; ++i) unique = absl::StrCat(std::string(name), "-", i);
  rules_.push_back(Rule{std::move(unique), -1, false});
  return static_cast<RuleId>(rules_.size() - 1);
}

Grammar::RuleId Grammar::FindRule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (rules_[i].name == name) return static_cast<RuleId>(i);
  }
  return -1;
}

absl::Status Grammar::Validate(const Limits& limits) const {
  if (num_exprs() > limits.max_exprs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "grammar too large: %d expressions (limit %d)", num_exprs(), limits.max_exprs));
  }
  if (num_rules() > limits.max_rules) {
    return absl::InvalidArgumentError(
        absl::StrFormat("grammar too large: %d rules (limit %d)", num_rules(), limits.max_rules));
  }
  if (root_ < 0 || root_ >= num_rules()) return absl::InvalidArgumentError("grammar has no root rule");
  for (const Rule& r : rules_) {
    if (r.body < 0 || r.body >= num_exprs()) {
      return absl::InvalidArgumentError(absl::StrCat("rule '", r.name, "' is referenced but not defined"));
    }
  }
  for (const Expr& e : exprs_) {
    if (e.kind == Kind::kRef && (e.rule < 0 || e.rule >= num_rules())) {
      return absl::InvalidArgumentError("reference to an unknown rule");
    }
    for (ExprId c : e.items) {
      if (c < 0 || c >= num_exprs()) return absl::InvalidArgumentError("dangling expression");
    }
    if (e.kind == Kind::kRepeat) {
      if (e.min < 0 || (e.max != kUnbounded && e.max < e.min)) {
        return absl::InvalidArgumentError(absl::StrFormat("bad repetition {%d,%d}", e.min, e.max));
      }
      if (e.min > limits.max_repeat || e.max > limits.max_repeat) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "repetition {%d,%d} exceeds the limit of %d", e.min, e.max, limits.max_repeat));
      }
    }
  }
  return absl::OkStatus();
}

std::string Grammar::ToString() const {
  std::string out;
  // Recursive printer; expression trees are shallow enough (nesting is bounded
  // by the parsers' depth limits).
  struct Printer {
    const Grammar& g;
    std::string* out;
    void Print(ExprId id, bool atom) {
      const Expr& e = g.exprs_[id];
      switch (e.kind) {
        case Kind::kEmpty: *out += "\"\""; break;
        case Kind::kLiteral: {
          *out += '"';
          for (size_t i = 0; i < e.literal.size();) {
            const uint8_t b = static_cast<uint8_t>(e.literal[i]);
            uint32_t cp = b;
            int len = 1;
            if (b >= 0xF0) { cp = b & 0x07; len = 4; }
            else if (b >= 0xE0) { cp = b & 0x0F; len = 3; }
            else if (b >= 0xC0) { cp = b & 0x1F; len = 2; }
            for (int k = 1; k < len && i + k < e.literal.size(); ++k) {
              cp = (cp << 6) | (static_cast<uint8_t>(e.literal[i + k]) & 0x3F);
            }
            AppendEscaped(cp, false, out);
            i += len;
          }
          *out += '"';
          break;
        }
        case Kind::kClass:
          *out += '[';
          for (const CodepointRange& r : e.ranges) {
            AppendEscaped(r.lo, true, out);
            if (r.hi != r.lo) {
              *out += '-';
              AppendEscaped(r.hi, true, out);
            }
          }
          *out += ']';
          break;
        case Kind::kRef: *out += g.rules_[e.rule].name; break;
        case Kind::kSeq:
          if (atom) *out += '(';
          for (size_t i = 0; i < e.items.size(); ++i) {
            if (i) *out += ' ';
            Print(e.items[i], true);
          }
          if (atom) *out += ')';
          break;
        case Kind::kAlt:
          if (e.items.empty()) { *out += "[^\\x00-\\U0010FFFF]"; break; }
          *out += '(';
          for (size_t i = 0; i < e.items.size(); ++i) {
            if (i) *out += " | ";
            Print(e.items[i], false);
          }
          *out += ')';
          break;
        case Kind::kRepeat:
          if (g.exprs_[e.items[0]].kind == Kind::kRepeat) {
            *out += '(';
            Print(e.items[0], false);
            *out += ')';
          } else {
            Print(e.items[0], true);
          }
          if (e.min == 0 && e.max == kUnbounded) *out += '*';
          else if (e.min == 1 && e.max == kUnbounded) *out += '+';
          else if (e.min == 0 && e.max == 1) *out += '?';
          else if (e.max == kUnbounded) *out += absl::StrFormat("{%d,}", e.min);
          else *out += absl::StrFormat("{%d,%d}", e.min, e.max);
          break;
      }
    }
  };
  Printer p{*this, &out};
  for (const Rule& r : rules_) {
    out += r.name;
    out += " ::= ";
    if (r.body >= 0) p.Print(r.body, false);
    out += '\n';
  }
  return out;
}

}  // namespace chunkattn::grammar
