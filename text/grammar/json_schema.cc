#include "text/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/grammar/regex.h"
#include "text/utf8.h"

namespace chunkattn::grammar {
namespace {

using Json = nlohmann::ordered_json;
using ExprId = Grammar::ExprId;
using RuleId = Grammar::RuleId;

// Digits of an integer part without an upper bound, and of an exponent: the
// largest value stays far inside a double's range.
constexpr int32_t kMaxIntDigits = 19;

// Deepest [ / { nesting of `text`, outside strings; scanned before parsing so
// that hostile nesting never reaches the JSON parser.
int MaxJsonNesting(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

std::string PointerEscape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

const std::set<std::string>& AnnotationKeywords() {
  static const std::set<std::string> k = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions"};
  return k;
}

const std::set<std::string>& SupportedKeywords() {
  static const std::set<std::string> k = {
      "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
      "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
      "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "nullable", "uniqueItems"};
  return k;
}

// Regexes for the string formats that are cheap to express (RFC 3339 dates
// and times; month days are not checked against the month).
const std::map<std::string, std::string>& FormatRegexes() {
  static const std::map<std::string, std::string> k = {
      {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"},
      {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
      {"date-time",
       "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
       "(\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
      {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
      {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
      {"email", "[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){0,8}\\.[A-Za-z]{2,24}"},
  };
  return k;
}

class SchemaConverter {
 public:
  SchemaConverter(const Json& root, const JsonSchemaOptions& options, const Limits& limits)
      : root_(root), options_(options), limits_(limits) {}

  absl::StatusOr<Grammar> Convert() {
    const RuleId root = g_.AddRule("root");
    g_.set_root(root);
    ASSIGN_OR_RETURN(ExprId body, Gen(root_, "#", 0));
    g_.SetBody(root, body);
    RETURN_IF_ERROR(g_.Validate(limits_));
    return std::move(g_);
  }

  // The rule for any JSON value of `kind` ("value" or "object").
  RuleId AnyRule(const std::string& kind) {
    if (value_rule_ < 0) BuildAnyRules();
    return kind == "object" ? object_rule_ : value_rule_;
  }
  Grammar& grammar() { return g_; }

 private:
  absl::Status Error(const std::string& path, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat("json schema at ", path, ": ", why));
  }

  // Whitespace pieces.
  ExprId Ws() {
    if (options_.whitespace == JsonWhitespace::kCompact) return g_.Empty();
    return g_.Repeat(g_.Class({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}}), 0,
                     options_.max_whitespace);
  }
  ExprId Comma() {
    if (options_.whitespace == JsonWhitespace::kCompact) return g_.Seq({g_.Literal(","), g_.Optional(g_.Literal(" "))});
    return g_.Seq({Ws(), g_.Literal(","), Ws()});
  }
  ExprId Colon() {
    if (options_.whitespace == JsonWhitespace::kCompact) return g_.Seq({g_.Literal(":"), g_.Optional(g_.Literal(" "))});
    return g_.Seq({Ws(), g_.Literal(":"), Ws()});
  }
  // open ws (members ws)? close, or open ws members ws close when required.
  ExprId Bracketed(const char* open, ExprId members, bool may_be_empty, const char* close) {
    ExprId inner = g_.Seq({members, Ws()});
    if (may_be_empty) inner = g_.Optional(inner);
    return g_.Seq({g_.Literal(open), Ws(), inner, g_.Literal(close)});
  }

  // One character of a JSON string in any valid spelling.
  ExprId StringChar() {
    const ExprId hex = g_.Class({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
    const ExprId nonsurrogate = g_.Alt({
        g_.Seq({g_.Class({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}), hex, hex, hex}),
        g_.Seq({g_.Class({{'d', 'd'}, {'D', 'D'}}), g_.Class({{'0', '7'}}), hex, hex})});
    const ExprId pair = g_.Seq({g_.Class({{'d', 'd'}, {'D', 'D'}}), g_.Class({{'8', '9'}, {'a', 'b'}, {'A', 'B'}}),
                                hex, hex, g_.Literal("\\u"), g_.Class({{'d', 'd'}, {'D', 'D'}}),
                                g_.Class({{'c', 'f'}, {'C', 'F'}}), hex, hex});
    const ExprId escape = g_.Seq({g_.Literal("\\"), g_.Alt({g_.Class({{'"', '"'}, {'\\', '\\'}, {'/', '/'},
                                                                        {'b', 'b'}, {'f', 'f'}, {'n', 'n'},
                                                                        {'r', 'r'}, {'t', 't'}}),
                                                              g_.Seq({g_.Literal("u"), g_.Alt({nonsurrogate, pair})})})});
    return g_.Alt({g_.Class({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, /*negated=*/true), escape});
  }

  // Exactly `v` (a const or enum value), spaced as the whitespace mode allows.
  ExprId ValueExpr(const Json& v) {
    if (v.is_object() && !v.empty()) {
      std::vector<ExprId> members;
      for (const auto& [key, x] : v.items()) {
        if (!members.empty()) members.push_back(Comma());
        members.push_back(g_.Seq({g_.Literal(Json(key).dump()), Colon(), ValueExpr(x)}));
      }
      return Bracketed("{", g_.Seq(std::move(members)), false, "}");
    }
    if (v.is_array() && !v.empty()) {
      std::vector<ExprId> items;
      for (const Json& x : v) {
        if (!items.empty()) items.push_back(Comma());
        items.push_back(ValueExpr(x));
      }
      return Bracketed("[", g_.Seq(std::move(items)), false, "]");
    }
    if (v.is_object() || v.is_array()) return Bracketed(v.is_object() ? "{" : "[", g_.Empty(), false, v.is_object() ? "}" : "]");
    return g_.Literal(v.dump());
  }

  RuleId StringRule(int32_t min_len, int32_t max_len) {
    const auto key = std::make_pair(min_len, max_len);
    auto it = string_rules_.find(key);
    if (it != string_rules_.end()) return it->second;
    const RuleId r = g_.AddRule(min_len == 0 && max_len == Grammar::kUnbounded
                                    ? "string"
                                    : absl::StrFormat("string-%d-%d", min_len, max_len));
    g_.SetNoInline(r);
    g_.SetBody(r, g_.Seq({g_.Literal("\""), g_.Repeat(StringChar(), min_len, max_len), g_.Literal("\"")}));
    string_rules_[key] = r;
    return r;
  }

  ExprId Digits1() { return g_.Plus(g_.Class({{'0', '9'}})); }
  // At most kMaxIntDigits digits: every integer then fits a 64-bit integer
  // or a double that JSON parsers accept (a 400-digit one overflows them).
  ExprId UnsignedInt() {
    return g_.Alt({g_.Literal("0"), g_.Seq({g_.Class({{'1', '9'}}),
                                            g_.Repeat(g_.Class({{'0', '9'}}), 0, kMaxIntDigits - 1)})});
  }
  RuleId NumberRule() {
    if (number_rule_ >= 0) return number_rule_;
    number_rule_ = g_.AddRule("number");
    g_.SetNoInline(number_rule_);
    g_.SetBody(number_rule_, g_.Seq({g_.Optional(g_.Literal("-")), UnsignedInt(),
                                     g_.Optional(g_.Seq({g_.Literal("."), Digits1()})),
                                     g_.Optional(g_.Seq({g_.Class({{'e', 'e'}, {'E', 'E'}}),
                                                         g_.Optional(g_.Class({{'+', '+'}, {'-', '-'}})),
                                                         g_.Repeat(g_.Class({{'0', '9'}}), 1, 2)}))}));
    return number_rule_;
  }
  RuleId IntegerRule() {
    if (integer_rule_ >= 0) return integer_rule_;
    integer_rule_ = g_.AddRule("integer");
    g_.SetNoInline(integer_rule_);
    g_.SetBody(integer_rule_, g_.Seq({g_.Optional(g_.Literal("-")), UnsignedInt()}));
    return integer_rule_;
  }

  // Same-length digit strings in [a, b] (a <= b, equal lengths).
  ExprId DigitRange(const std::string& a, const std::string& b) {
    if (a.empty()) return g_.Empty();
    if (a == b) return g_.Literal(a);
    if (a[0] == b[0]) return g_.Seq({g_.Literal(a.substr(0, 1)), DigitRange(a.substr(1), b.substr(1))});
    const size_t n = a.size() - 1;
    const bool a_rest_zero = a.find_first_not_of('0', 1) == std::string::npos;
    const bool b_rest_nine = b.find_first_not_of('9', 1) == std::string::npos;
    const char mid_lo = a_rest_zero ? a[0] : a[0] + 1;
    const char mid_hi = b_rest_nine ? b[0] : b[0] - 1;
    std::vector<ExprId> alts;
    if (!a_rest_zero) {
      alts.push_back(g_.Seq({g_.Literal(a.substr(0, 1)), DigitRange(a.substr(1), std::string(n, '9'))}));
    }
    if (mid_lo <= mid_hi) {
      alts.push_back(g_.Seq({g_.Class({{static_cast<uint32_t>(mid_lo), static_cast<uint32_t>(mid_hi)}}),
                             g_.Repeat(g_.Class({{'0', '9'}}), static_cast<int32_t>(n), static_cast<int32_t>(n))}));
    }
    if (!b_rest_nine) {
      alts.push_back(g_.Seq({g_.Literal(b.substr(0, 1)), DigitRange(std::string(n, '0'), b.substr(1))}));
    }
    return g_.Alt(std::move(alts));
  }

  // Canonical (no leading zeros) decimal integers in [lo, hi], 0 <= lo;
  // hi unbounded when empty.
  ExprId NonNegIntRange(int64_t lo, std::optional<int64_t> hi) {
    std::vector<ExprId> alts;
    const std::string lo_s = std::to_string(lo);
    const size_t max_len = hi ? std::to_string(*hi).size() : lo_s.size();
    for (size_t len = lo_s.size(); len <= max_len; ++len) {
      std::string a = len == lo_s.size() ? lo_s : "1" + std::string(len - 1, '0');
      std::string b = std::string(len, '9');
      if (hi && len == max_len) b = std::to_string(*hi);
      if (a.size() == b.size() && a <= b) alts.push_back(DigitRange(a, b));
    }
    if (!hi && static_cast<int32_t>(lo_s.size()) < kMaxIntDigits) {
      alts.push_back(g_.Seq({g_.Class({{'1', '9'}}),
                             g_.Repeat(g_.Class({{'0', '9'}}), static_cast<int32_t>(lo_s.size()), kMaxIntDigits - 1)}));
    }
    return g_.Alt(std::move(alts));
  }

  ExprId IntRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    std::vector<ExprId> alts;
    if (!hi || *hi >= 0) alts.push_back(NonNegIntRange(lo ? std::max<int64_t>(*lo, 0) : 0, hi));
    if (!lo || *lo < 0) {
      const int64_t mag_lo = (hi && *hi < 0) ? -*hi : 1;
      std::optional<int64_t> mag_hi;
      if (lo) mag_hi = -*lo;
      alts.push_back(g_.Seq({g_.Literal("-"), NonNegIntRange(mag_lo, mag_hi)}));
    }
    return g_.Alt(std::move(alts));
  }

  // Decimal numbers without exponent in [lo, hi], 0 <= lo, integral bounds.
  ExprId NonNegRealRange(int64_t lo, std::optional<int64_t> hi) {
    const ExprId frac = g_.Optional(g_.Seq({g_.Literal("."), Digits1()}));
    if (!hi) return g_.Seq({NonNegIntRange(lo, std::nullopt), frac});
    std::vector<ExprId> alts;
    if (*hi - 1 >= lo) alts.push_back(g_.Seq({NonNegIntRange(lo, *hi - 1), frac}));
    alts.push_back(g_.Seq({g_.Literal(std::to_string(*hi)),
                           g_.Optional(g_.Seq({g_.Literal("."), g_.Plus(g_.Literal("0"))}))}));
    return g_.Alt(std::move(alts));
  }

  ExprId RealRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    std::vector<ExprId> alts;
    if (!hi || *hi >= 0) alts.push_back(NonNegRealRange(lo ? std::max<int64_t>(*lo, 0) : 0, hi));
    if (!lo || *lo < 0) {
      std::optional<int64_t> mag_hi;
      if (lo) mag_hi = -*lo;
      const int64_t mag_lo = (hi && *hi < 0) ? -*hi : 0;
      alts.push_back(g_.Seq({g_.Literal("-"), NonNegRealRange(mag_lo, mag_hi)}));
    }
    return g_.Alt(std::move(alts));
  }

  void BuildAnyRules() {
    value_rule_ = g_.AddRule("value");
    object_rule_ = g_.AddRule("object");
    array_rule_ = g_.AddRule("array");
    for (RuleId r : {value_rule_, object_rule_, array_rule_}) g_.SetNoInline(r);
    const RuleId str = StringRule(0, Grammar::kUnbounded);
    g_.SetBody(value_rule_, g_.Alt({g_.Ref(object_rule_), g_.Ref(array_rule_), g_.Ref(str), g_.Ref(NumberRule()),
                                    g_.Literal("true"), g_.Literal("false"), g_.Literal("null")}));
    const ExprId member = g_.Seq({g_.Ref(str), Colon(), g_.Ref(value_rule_)});
    g_.SetBody(object_rule_,
               Bracketed("{", g_.Seq({member, g_.Star(g_.Seq({Comma(), member}))}), true, "}"));
    const ExprId item = g_.Ref(value_rule_);
    g_.SetBody(array_rule_, Bracketed("[", g_.Seq({item, g_.Star(g_.Seq({Comma(), item}))}), true, "]"));
  }

  absl::StatusOr<std::optional<int64_t>> IntBound(const Json& s, const std::string& path, const char* key,
                                                  bool is_min, bool integer) {
    std::optional<int64_t> out;
    auto get = [&](const char* k) -> absl::StatusOr<std::optional<double>> {
      if (!s.contains(k)) return std::optional<double>();
      const Json& v = s[k];
      if (v.is_boolean()) return Error(path, absl::StrCat("draft-04 boolean '", k, "' is not supported"));
      if (!v.is_number()) return Error(path, absl::StrCat("'", k, "' must be a number"));
      const double d = v.get<double>();
      if (std::fabs(d) > 1e15) return Error(path, absl::StrCat("'", k, "' is out of the supported range"));
      return std::optional<double>(d);
    };
    ASSIGN_OR_RETURN(std::optional<double> inclusive, get(key));
    const char* exclusive_key = is_min ? "exclusiveMinimum" : "exclusiveMaximum";
    ASSIGN_OR_RETURN(std::optional<double> exclusive, get(exclusive_key));
    if (!integer) {
      if (exclusive) {
        return Error(path, absl::StrCat("'", exclusive_key, "' is not supported for type number"));
      }
      if (inclusive && *inclusive != std::floor(*inclusive)) {
        return Error(path, absl::StrCat("non-integral '", key, "' is not supported for type number"));
      }
    }
    if (inclusive) out = static_cast<int64_t>(is_min ? std::ceil(*inclusive) : std::floor(*inclusive));
    if (exclusive) {
      const int64_t e = static_cast<int64_t>(is_min ? std::floor(*exclusive) + 1 : std::ceil(*exclusive) - 1);
      out = out ? (is_min ? std::max(*out, e) : std::min(*out, e)) : e;
    }
    return out;
  }

  absl::StatusOr<int32_t> Count(const Json& s, const std::string& path, const char* key, int32_t dflt) {
    if (!s.contains(key)) return dflt;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return Error(path, absl::StrCat("'", key, "' must be a non-negative integer"));
    }
    if (v.get<int64_t>() > limits_.max_repeat) {
      return Error(path, absl::StrFormat("'%s' %d exceeds the limit of %d", key, v.get<int64_t>(),
                                         limits_.max_repeat));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }

  absl::StatusOr<const Json*> ResolveRef(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') return Error(path, absl::StrCat("$ref '", ref, "' is not local (only '#...')"));
    const Json* cur = &root_;
    size_t pos = 1;
    if (pos < ref.size() && ref[pos] != '/') return Error(path, absl::StrCat("$ref '", ref, "' is not a JSON pointer"));
    while (pos < ref.size()) {
      const size_t next = ref.find('/', pos + 1);
      std::string token = ref.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
      std::string key;
      for (size_t i = 0; i < token.size(); ++i) {
        if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
          key += token[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          key += token[i];
        }
      }
      if (cur->is_object() && cur->contains(key)) {
        cur = &(*cur)[key];
      } else if (cur->is_array() && !key.empty() && key.size() < 10 &&
                 key.find_first_not_of("0123456789") == std::string::npos && std::stoul(key) < cur->size()) {
        cur = &(*cur)[std::stoul(key)];
      } else {
        return Error(path, absl::StrCat("$ref '", ref, "' does not resolve"));
      }
      pos = next == std::string::npos ? ref.size() : next;
    }
    return cur;
  }

  absl::StatusOr<ExprId> Gen(const Json& s, const std::string& path, int depth) {
    if (++nodes_ > limits_.max_schema_nodes) {
      return Error(path, absl::StrFormat("schema too large: over %d subschemas", limits_.max_schema_nodes));
    }
    if (depth > limits_.max_nesting_depth) {
      return Error(path, absl::StrFormat("schema nested deeper than %d", limits_.max_nesting_depth));
    }
    if (s.is_boolean()) return s.get<bool>() ? g_.Ref(AnyRule("value")) : g_.Alt({});
    if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (AnnotationKeywords().count(key)) continue;
      if (!SupportedKeywords().count(key)) return Error(path, absl::StrCat("unsupported keyword '", key, "'"));
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) {
      return Error(path, "unsupported keyword 'uniqueItems' (only false)");
    }
    ExprId e;
    if (s.contains("nullable") && s["nullable"] == true) {
      Json inner = s;
      inner.erase("nullable");
      ASSIGN_OR_RETURN(e, Gen(inner, path, depth));
      return g_.Alt({e, g_.Literal("null")});
    }
    if (s.contains("$ref")) {
      if (s.size() > 1) {
        for (const auto& [key, value] : s.items()) {
          if (key != "$ref" && !AnnotationKeywords().count(key)) {
            return Error(path, absl::StrCat("keyword '", key, "' beside $ref is not supported"));
          }
        }
      }
      if (!s["$ref"].is_string()) return Error(path, "$ref must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      auto it = ref_rules_.find(ref);
      if (it != ref_rules_.end()) return g_.Ref(it->second);
      ASSIGN_OR_RETURN(const Json* target, ResolveRef(ref, path));
      const RuleId r = g_.AddRule(absl::StrCat("ref-", ref_rules_.size()));
      g_.SetNoInline(r);
      ref_rules_[ref] = r;
      ASSIGN_OR_RETURN(ExprId body, Gen(*target, ref, depth + 1));
      g_.SetBody(r, body);
      return g_.Ref(r);
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(key)) continue;
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) return Error(path, absl::StrCat("'", key, "' must be a non-empty array"));
      for (const auto& [other, value] : s.items()) {
        if (other != key && !AnnotationKeywords().count(other)) {
          return Error(path, absl::StrCat("keyword '", other, "' beside '", key, "' is not supported"));
        }
      }
      if (std::string(key) == "allOf" && list.size() > 1) {
        return Error(path, "'allOf' with more than one schema is not supported");
      }
      std::vector<ExprId> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        ASSIGN_OR_RETURN(ExprId alt, Gen(list[i], absl::StrCat(path, "/", key, "/", i), depth + 1));
        alts.push_back(alt);
      }
      return g_.Alt(std::move(alts));
    }
    if (s.contains("const")) return ValueExpr(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) return Error(path, "'enum' must be an array");
      std::vector<ExprId> alts;
      for (const Json& v : s["enum"]) alts.push_back(ValueExpr(v));
      return g_.Alt(std::move(alts));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Error(path, "'type' must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Error(path, "'type' must be a string or an array of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return g_.Ref(AnyRule("value"));
    }
    std::vector<ExprId> alts;
    for (const std::string& type : types) {
      ASSIGN_OR_RETURN(ExprId alt, GenType(s, type, path, depth));
      alts.push_back(alt);
    }
    return g_.Alt(std::move(alts));
  }

  absl::StatusOr<ExprId> GenType(const Json& s, const std::string& type, const std::string& path, int depth) {
    if (type == "null") return g_.Literal("null");
    if (type == "boolean") return g_.Alt({g_.Literal("true"), g_.Literal("false")});
    if (type == "integer" || type == "number") {
      const bool integer = type == "integer";
      ASSIGN_OR_RETURN(std::optional<int64_t> lo, IntBound(s, path, "minimum", true, integer));
      ASSIGN_OR_RETURN(std::optional<int64_t> hi, IntBound(s, path, "maximum", false, integer));
      if (!lo && !hi) return g_.Ref(integer ? IntegerRule() : NumberRule());
      if (lo && hi && *lo > *hi) return g_.Alt({});  // no value: another anyOf branch may still match
      return integer ? IntRange(lo, hi) : RealRange(lo, hi);
    }
    if (type == "string") return GenString(s, path);
    if (type == "object") return GenObject(s, path, depth);
    if (type == "array") return GenArray(s, path, depth);
    return Error(path, absl::StrCat("unknown type '", type, "'"));
  }

  absl::StatusOr<ExprId> GenString(const Json& s, const std::string& path) {
    ASSIGN_OR_RETURN(int32_t min_len, Count(s, path, "minLength", 0));
    ASSIGN_OR_RETURN(int32_t max_len, Count(s, path, "maxLength", Grammar::kUnbounded));
    if (max_len != Grammar::kUnbounded && max_len < min_len) return Error(path, "maxLength < minLength");
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    std::string pattern;
    bool full_match = false;
    if (s.contains("format")) {
      if (!s["format"].is_string()) return Error(path, "'format' must be a string");
      auto it = FormatRegexes().find(s["format"].get<std::string>());
      if (it == FormatRegexes().end()) {
        return Error(path, absl::StrCat("unsupported format '", s["format"].get<std::string>(), "'"));
      }
      pattern = it->second;
      full_match = true;
    }
    if (s.contains("pattern")) {
      if (!pattern.empty()) return Error(path, "'pattern' together with 'format' is not supported");
      if (!s["pattern"].is_string()) return Error(path, "'pattern' must be a string");
      pattern = s["pattern"].get<std::string>();
    }
    if (!pattern.empty()) {
      if (has_len) return Error(path, "'pattern' or 'format' together with minLength/maxLength is not supported");
      RegexOptions ro;
      ro.full_match = full_match;
      ro.json_string = true;
      auto body = AddRegex(&g_, pattern, ro, limits_);
      if (!body.ok()) return Error(path, absl::StrCat("'pattern': ", body.status().message()));
      // A rule of its own that calls nothing: its positions are classified
      // once per vocabulary (compiled_grammar.cc), whoever uses it.
      const RuleId r = g_.AddRule("pattern-string");
      g_.SetNoInline(r);
      g_.SetBody(r, g_.Seq({g_.Literal("\""), *body, g_.Literal("\"")}));
      return g_.Ref(r);
    }
    return g_.Ref(StringRule(min_len, max_len));
  }

  // Property names other than `exclude`, each in its one canonical JSON
  // spelling (so that a declared name cannot come back escaped differently).
  ExprId OtherKey(const std::vector<std::string>& exclude) {
    struct Node {
      std::map<uint32_t, int> children;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : exclude) {
      int cur = 0;
      for (size_t i = 0; i < name.size();) {
        const uint8_t b = static_cast<uint8_t>(name[i]);
        const int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
        uint32_t cp = len == 1 ? b : (b & (0x7F >> len));
        for (int k = 1; k < len && i + k < name.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(name[i + k]) & 0x3F);
        i += len;
        auto it = trie[cur].children.find(cp);
        if (it == trie[cur].children.end()) {
          trie.push_back(Node());
          it = trie[cur].children.emplace(cp, static_cast<int>(trie.size() - 1)).first;
        }
        cur = it->second;
      }
      trie[cur].terminal = true;
    }
    const ExprId free_rest = g_.Seq({g_.Star(JsonStringClass(&g_, NormalizeRanges({}, true))), g_.Literal("\"")});
    std::function<ExprId(int)> node_expr = [&](int n) -> ExprId {
      std::vector<ExprId> alts;
      if (!trie[n].terminal) alts.push_back(g_.Literal("\""));
      std::vector<CodepointRange> used;
      for (const auto& [cp, child] : trie[n].children) {
        used.push_back({cp, cp});
        alts.push_back(g_.Seq({JsonStringClass(&g_, {{cp, cp}}), node_expr(child)}));
      }
      alts.push_back(g_.Seq({JsonStringClass(&g_, NormalizeRanges(used, true)), free_rest}));
      return g_.Alt(std::move(alts));
    };
    return g_.Seq({g_.Literal("\""), node_expr(0)});
  }

  absl::StatusOr<ExprId> GenObject(const Json& s, const std::string& path, int depth) {
    struct Prop {
      ExprId kv;
      bool required;
    };
    std::vector<Prop> props;
    std::vector<std::string> names;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Error(path, "'required' must be an array");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Error(path, "'required' must hold strings");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return Error(path, "'properties' must be an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        ASSIGN_OR_RETURN(ExprId value,
                         Gen(sub, absl::StrCat(path, "/properties/", PointerEscape(name)), depth + 1));
        props.push_back({g_.Seq({g_.Literal(Json(name).dump()), Colon(), value}), required.count(name) > 0});
        names.push_back(name);
      }
    }
    for (const std::string& r : required) {
      if (std::find(names.begin(), names.end(), r) == names.end()) {
        // Required but undeclared: its value is whatever additionalProperties allows.
        return Error(path, absl::StrCat("required property '", r, "' is not in 'properties'"));
      }
    }
    std::optional<ExprId> extra;  // one additional member: key colon value
    const bool has_additional = s.contains("additionalProperties");
    if ((has_additional && s["additionalProperties"] != false) || (!has_additional && !options_.strict)) {
      ExprId value;
      if (has_additional) {
        ASSIGN_OR_RETURN(value, Gen(s["additionalProperties"], path + "/additionalProperties", depth + 1));
      } else {
        value = g_.Ref(AnyRule("value"));
      }
      extra = g_.Seq({OtherKey(names), Colon(), value});
    }
    // Members in declared order, optional ones skippable, extras last:
    // tail[i] follows an emitted member (each present one starts with a
    // comma); head(i) is the members from i when none is emitted yet.
    const size_t n = props.size();
    std::vector<ExprId> tail(n + 1);
    tail[n] = extra ? g_.Star(g_.Seq({Comma(), *extra})) : g_.Empty();
    const bool share_tails = n > 6;  // keeps the automaton linear, not quadratic, in n
    for (size_t i = n; i-- > 0;) {
      ExprId part = g_.Seq({Comma(), props[i].kv});
      if (!props[i].required) part = g_.Optional(part);
      tail[i] = g_.Seq({part, tail[i + 1]});
      if (share_tails && i + 1 < n) {
        const RuleId r = g_.AddRule("members");
        g_.SetNoInline(r);
        g_.SetBody(r, tail[i]);
        tail[i] = g_.Ref(r);
      }
    }
    std::vector<ExprId> firsts;
    bool may_be_empty = true;
    for (size_t i = 0; i < n; ++i) {
      firsts.push_back(g_.Seq({props[i].kv, tail[i + 1]}));
      if (props[i].required) {
        may_be_empty = false;
        break;
      }
    }
    if (may_be_empty && extra) firsts.push_back(g_.Seq({*extra, tail[n]}));
    const ExprId members = g_.Alt(std::move(firsts));
    const RuleId r = g_.AddRule("object-schema");
    g_.SetNoInline(r);
    g_.SetBody(r, Bracketed("{", members, may_be_empty, "}"));
    return g_.Ref(r);
  }

  absl::StatusOr<ExprId> GenArray(const Json& s, const std::string& path, int depth) {
    ASSIGN_OR_RETURN(int32_t min_items, Count(s, path, "minItems", 0));
    ASSIGN_OR_RETURN(int32_t max_items, Count(s, path, "maxItems", Grammar::kUnbounded));
    if (max_items != Grammar::kUnbounded && max_items < min_items) return Error(path, "maxItems < minItems");
    std::vector<ExprId> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return Error(path, "'prefixItems' must be an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
        ASSIGN_OR_RETURN(ExprId e, Gen(s["prefixItems"][i], absl::StrCat(path, "/prefixItems/", i), depth + 1));
        prefix.push_back(e);
      }
    }
    std::optional<ExprId> item;
    if (s.contains("items")) {
      if (s["items"] != false) {
        if (s["items"].is_array()) return Error(path, "array-form 'items' (draft-04 tuples) is not supported; use prefixItems");
        ASSIGN_OR_RETURN(item, Gen(s["items"], path + "/items", depth + 1));
      }
    } else if (prefix.empty() || !options_.strict) {
      item = g_.Ref(AnyRule("value"));
    }
    const int32_t k = static_cast<int32_t>(prefix.size());
    const int32_t used_prefix = max_items == Grammar::kUnbounded ? k : std::min(k, max_items);
    if (min_items > k && !item) return Error(path, "minItems exceeds the prefixItems allowed");
    int32_t tail_min = std::max(0, min_items - k);
    int32_t tail_max = !item ? 0 : max_items == Grammar::kUnbounded ? Grammar::kUnbounded : std::max(0, max_items - k);
    // After the prefix: the homogeneous items.
    ExprId rest;
    if (tail_max == 0) {
      rest = g_.Empty();
    } else if (used_prefix == 0) {
      const int32_t more_max = tail_max == Grammar::kUnbounded ? Grammar::kUnbounded : tail_max - 1;
      // Not optional when tail_min is 0: then minItems is 0, and the empty
      // array is the body's own Optional below.
      rest = g_.Seq({*item, g_.Repeat(g_.Seq({Comma(), *item}), std::max(0, tail_min - 1), more_max)});
    } else {
      rest = g_.Repeat(g_.Seq({Comma(), *item}), tail_min, tail_max);
    }
    for (int32_t j = used_prefix; j-- > 0;) {
      ExprId part = g_.Seq({j == 0 ? prefix[j] : g_.Seq({Comma(), prefix[j]}), rest});
      if (j >= min_items && j > 0) part = g_.Optional(part);  // j = 0: the body's Optional
      rest = part;
    }
    // `rest` matches at least one item, so "[" and "]" have one run of
    // whitespace between them whether the array is empty or not (an empty
    // `rest` inside the Optional would allow two: twice max_whitespace).
    const RuleId r = g_.AddRule("array-schema");
    g_.SetNoInline(r);
    ExprId items;
    if (tail_max == 0 && used_prefix == 0) {
      items = g_.Empty();  // only the empty array
    } else if (min_items == 0) {
      items = g_.Optional(g_.Seq({rest, Ws()}));
    } else {
      items = g_.Seq({rest, Ws()});
    }
    g_.SetBody(r, g_.Seq({g_.Literal("["), Ws(), items, g_.Literal("]")}));
    return g_.Ref(r);
  }

  const Json& root_;
  const JsonSchemaOptions& options_;
  const Limits& limits_;
  Grammar g_;
  int64_t nodes_ = 0;
  absl::flat_hash_map<std::string, RuleId> ref_rules_;
  std::map<std::pair<int32_t, int32_t>, RuleId> string_rules_;
  RuleId number_rule_ = -1, integer_rule_ = -1;
  RuleId value_rule_ = -1, object_rule_ = -1, array_rule_ = -1;
};

}  // namespace

absl::StatusOr<Grammar> JsonSchemaToGrammar(std::string_view schema_json, const JsonSchemaOptions& options,
                                            const Limits& limits) {
  if (static_cast<int64_t>(schema_json.size()) > limits.max_input_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("json schema too large: %d bytes (limit %d)",
                                                      schema_json.size(), limits.max_input_bytes));
  }
  if (MaxJsonNesting(schema_json) > limits.max_nesting_depth) {
    return absl::InvalidArgumentError(
        absl::StrFormat("json schema nested deeper than %d", limits.max_nesting_depth));
  }
  Json schema = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("json schema is not valid JSON");
  return SchemaConverter(schema, options, limits).Convert();
}

Grammar JsonObjectGrammar(const JsonSchemaOptions& options) {
  const Json unused;
  const Limits limits;
  SchemaConverter c(unused, options, limits);
  Grammar& g = c.grammar();
  const RuleId object = c.AnyRule("object");
  const RuleId root = g.AddRule("root");
  g.SetBody(root, g.Ref(object));
  g.set_root(root);
  return std::move(g);
}

absl::StatusOr<Grammar> ChoiceToGrammar(const std::vector<std::string>& choices, const Limits& limits) {
  if (choices.empty()) return absl::InvalidArgumentError("choice: the list is empty");
  int64_t bytes = 0;
  Grammar g;
  std::vector<ExprId> alts;
  for (const std::string& c : choices) {
    bytes += static_cast<int64_t>(c.size());
    if (!IsValidUtf8(c)) return absl::InvalidArgumentError("choice: a string is not valid UTF-8");
    if (bytes > limits.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat("choice: too large (limit %d bytes)", limits.max_input_bytes));
    }
    alts.push_back(g.Literal(c));
  }
  const RuleId root = g.AddRule("root");
  g.SetBody(root, g.Alt(std::move(alts)));
  g.set_root(root);
  RETURN_IF_ERROR(g.Validate(limits));
  return g;
}

}  // namespace chunkattn::grammar
