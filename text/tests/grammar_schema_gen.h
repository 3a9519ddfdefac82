// Test support for the grammar tests: seeded random JSON Schemas, instances
// generated from a schema (independently of the grammar engine), and a
// reference validator with the converter's strict-mode semantics.
#ifndef CHUNKATTN_TEXT_TESTS_GRAMMAR_SCHEMA_GEN_H_
#define CHUNKATTN_TEXT_TESTS_GRAMMAR_SCHEMA_GEN_H_

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace chunkattn::grammar::schema_gen {

using Json = nlohmann::ordered_json;

// --- Reference validator (strict mode: absent additionalProperties is false,
// prefixItems without items admits nothing more) -----------------------------

inline bool SearchRegex(const std::string& pattern, const std::string& s, bool full) {
  int err;
  PCRE2_SIZE off;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | (full ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0), &err, &off, nullptr);
  if (code == nullptr) return false;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, data, nullptr);
  pcre2_match_data_free(data);
  pcre2_code_free(code);
  return rc >= 0;
}

inline size_t Codepoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline const Json* Resolve(const Json& root, const std::string& ref) {
  const Json* cur = &root;
  size_t pos = 1;
  while (pos < ref.size()) {
    const size_t next = ref.find('/', pos + 1);
    const std::string key = ref.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    if (!cur->contains(key)) return nullptr;
    cur = &(*cur)[key];
    pos = next == std::string::npos ? ref.size() : next;
  }
  return cur;
}

inline bool Valid(const Json& s, const Json& v, const Json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("nullable") && s["nullable"] == true && v.is_null()) return true;
  if (s.contains("$ref")) {
    const Json* t = Resolve(root, s["$ref"].get<std::string>());
    return t != nullptr && Valid(*t, v, root);
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k)) continue;
    bool any = false;
    for (const Json& sub : s[k]) any = any || Valid(sub, v, root);
    if (!any) return false;
  }
  if (s.contains("const") && !(s["const"] == v)) return false;
  if (s.contains("enum")) {
    bool any = false;
    for (const Json& e : s["enum"]) any = any || e == v;
    if (!any) return false;
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string()) types.push_back(s["type"]);
    else for (const Json& t : s["type"]) types.push_back(t);
    bool ok = false;
    for (const std::string& t : types) {
      ok = ok || (t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) ||
           (t == "null" && v.is_null()) || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
           (t == "number" && v.is_number()) ||
           (t == "integer" && (v.is_number_integer() ||
                               (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))));
    }
    if (!ok) return false;
  }
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    if (s.contains("minLength") && Codepoints(str) < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && Codepoints(str) > s["maxLength"].get<size_t>()) return false;
    if (s.contains("pattern") && !SearchRegex(s["pattern"], str, false)) return false;
    if (s.contains("format")) {
      static const std::map<std::string, std::string> formats = {
          {"date", "\\d\\d\\d\\d-(0[1-9]|1[012])-(0[1-9]|[12]\\d|3[01])"},
          {"uuid", "[[:xdigit:]]{8}(-[[:xdigit:]]{4}){3}-[[:xdigit:]]{12}"},
          {"ipv4", "(\\d|[1-9]\\d|1\\d\\d|2[0-4]\\d|25[0-5])(\\.(\\d|[1-9]\\d|1\\d\\d|2[0-4]\\d|25[0-5])){3}"}};
      if (!SearchRegex(formats.at(s["format"]), str, true)) return false;
    }
  }
  if (v.is_number()) {
    const double d = v.get<double>();
    if (s.contains("minimum") && d < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && d > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && d <= s["exclusiveMinimum"].get<double>()) return false;
    if (s.contains("exclusiveMaximum") && d >= s["exclusiveMaximum"].get<double>()) return false;
  }
  const bool object_schema = s.contains("properties") || s.contains("required") ||
                             s.contains("additionalProperties") ||
                             (s.contains("type") && s["type"].dump().find("\"object\"") != std::string::npos);
  if (v.is_object() && object_schema) {
    const Json props = s.value("properties", Json::object());
    if (s.contains("required")) {
      for (const Json& r : s["required"]) {
        if (!v.contains(r.get<std::string>())) return false;
      }
    }
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!Valid(props[k], x, root)) return false;
      } else if (!s.contains("additionalProperties") || !Valid(s["additionalProperties"], x, root)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    const size_t k = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i < k) {
        if (!Valid(s["prefixItems"][i], v[i], root)) return false;
      } else if (s.contains("items")) {
        if (!Valid(s["items"], v[i], root)) return false;
      } else if (k > 0) {
        return false;
      }
    }
  }
  return true;
}

// --- Random schemas and instances of them --------------------------------------

struct Pattern {
  const char* regex;
  std::function<std::string(std::mt19937&)> sample;
};

inline const std::vector<Pattern>& Patterns() {
  static const std::vector<Pattern> p = {
      {"^[a-z]{2,5}$", [](std::mt19937& r) { return std::string(2 + r() % 4, static_cast<char>('a' + r() % 26)); }},
      {"^\\d+(\\.\\d\\d)?$", [](std::mt19937& r) { return std::to_string(r() % 1000) + (r() % 2 ? ".25" : ""); }},
      {"ab", [](std::mt19937& r) { return std::string(r() % 3, 'x') + "ab" + (r() % 2 ? "\"q\\" : ""); }},
      {"^(yes|no)\"?$", [](std::mt19937& r) { return std::string(r() % 2 ? "yes" : "no") + (r() % 2 ? "\"" : ""); }},
  };
  return p;
}

inline const std::vector<std::string>& Names() {
  static const std::vector<std::string> n = {"a", "name", "x_y", "\xC3\xA9t\xC3\xA9", "with space", "q\"uote",
                                             "back\\slash", "id"};
  return n;
}

inline Json RandomSchema(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  Json s = Json::object();
  switch (pick(depth > 0 ? 12 : 7)) {
    case 0:
      s["type"] = "string";
      if (pick(2)) {
        s["minLength"] = pick(3);
        if (pick(2)) s["maxLength"] = s["minLength"].get<int>() + pick(5);
      } else if (pick(2)) {
        s["pattern"] = Patterns()[pick(static_cast<int>(Patterns().size()))].regex;
      } else if (pick(3) == 0) {
        s["format"] = std::vector<const char*>{"date", "uuid", "ipv4"}[pick(3)];
      }
      break;
    case 1:
      s["type"] = "integer";
      if (pick(2)) s["minimum"] = pick(100) - 50;
      if (pick(4) == 0) s["exclusiveMinimum"] = -7;
      if (pick(2)) {
        s[pick(2) ? "maximum" : "exclusiveMaximum"] = std::max(s.value("minimum", -50), s.value("exclusiveMinimum", -50)) + 2 + pick(200);
      }
      break;
    case 2:
      s["type"] = "number";
      if (pick(2)) s["minimum"] = pick(20) - 10;
      if (pick(2)) s["maximum"] = s.value("minimum", -10) + pick(30);
      break;
    case 3: s["type"] = "boolean"; break;
    case 4: s["type"] = "null"; break;
    case 5: s["enum"] = Json::parse(R"(["a", 1, null, true, {"k": [1, 2]}, "é\"q", -2.5])"); break;
    case 6: s["const"] = std::vector<Json>{Json("c\\onst"), Json(42), Json::parse(R"({"x":[null]})")}[pick(3)]; break;
    case 7: {
      s["type"] = "object";
      Json props = Json::object();
      std::vector<std::string> req;
      const int n = pick(5);
      for (int i = 0; i < n; ++i) {
        const std::string& name = Names()[pick(static_cast<int>(Names().size()))];
        if (props.contains(name)) continue;
        props[name] = RandomSchema(rng, depth - 1);
        if (pick(2)) req.push_back(name);
      }
      s["properties"] = props;
      if (!req.empty()) s["required"] = req;
      const int ap = pick(4);
      if (ap == 1) s["additionalProperties"] = false;
      if (ap == 2) s["additionalProperties"] = true;
      if (ap == 3) s["additionalProperties"] = Json::parse(R"({"type":"integer"})");
      break;
    }
    case 8:
      s["type"] = "array";
      s["items"] = RandomSchema(rng, depth - 1);
      if (pick(2)) s["minItems"] = pick(3);
      if (pick(2)) s["maxItems"] = s.value("minItems", 0) + pick(4);
      if (pick(4) == 0) {
        s["prefixItems"] = Json::array({RandomSchema(rng, depth - 1), RandomSchema(rng, depth - 1)});
        if (pick(2)) s.erase("items");
      }
      break;
    case 9: s["anyOf"] = Json::array({RandomSchema(rng, depth - 1), RandomSchema(rng, depth - 1)}); break;
    case 10: s["type"] = pick(2) ? Json::array({"string", "null"}) : Json::array({"integer", "boolean"}); break;
    default:
      s = RandomSchema(rng, depth - 1);
      if (!s.contains("$ref") && !s.contains("anyOf")) s["nullable"] = true;
      break;
  }
  if (pick(5) == 0) s["description"] = "an annotation";
  return s;
}

inline std::string RandomText(std::mt19937& rng, size_t n) {
  static const std::vector<std::string> chars = {"a", "Z", " ", "\xC3\xA9", "\"", "\\", "\n", "\t",
                                                 "\xE6\x9D\xB1", "\xF0\x9F\x98\x80", "/", "\x01"};
  std::string s;
  for (size_t i = 0; i < n; ++i) s += chars[rng() % chars.size()];
  return s;
}

inline Json Instance(const Json& s, const Json& root, std::mt19937& rng, int depth = 0) {
  const bool deep = depth > 5;  // recursive schemas: stop growing
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  if (s.is_boolean()) return 7;
  if (s.contains("nullable") && pick(4) == 0) return nullptr;
  if (s.contains("$ref")) return Instance(*Resolve(root, s["$ref"]), root, rng, depth + 1);
  if (s.contains("anyOf")) return Instance(s["anyOf"][pick(static_cast<int>(s["anyOf"].size()))], root, rng, depth + 1);
  if (s.contains("const")) return s["const"];
  if (s.contains("enum")) return s["enum"][pick(static_cast<int>(s["enum"].size()))];
  std::string type = s["type"].is_string() ? s["type"].get<std::string>() : s["type"][pick(2)].get<std::string>();
  if (type == "null") return nullptr;
  if (type == "boolean") return pick(2) == 1;
  if (type == "string") {
    if (s.contains("pattern")) {
      for (const Pattern& p : Patterns()) {
        if (s["pattern"] == p.regex) return p.sample(rng);
      }
    }
    if (s.contains("format")) {
      const std::string f = s["format"];
      if (f == "date") return absl::StrCat(1900 + pick(200), "-0", 1 + pick(9), "-", 10 + pick(19));
      if (f == "uuid") return "123e4567-e89b-12d3-a456-426614174000";
      return absl::StrCat(pick(256), ".", pick(256), ".0.", pick(10));
    }
    const size_t lo = s.value("minLength", 0), hi = s.value("maxLength", static_cast<int>(lo) + 6);
    return RandomText(rng, lo + rng() % (hi - lo + 1));
  }
  if (type == "integer") {
    int64_t lo = s.value("minimum", -1000), hi = s.value("maximum", 1000);
    if (s.contains("exclusiveMaximum")) hi = s["exclusiveMaximum"].get<int64_t>() - 1;
    if (s.contains("exclusiveMinimum")) lo = std::max<int64_t>(lo, s["exclusiveMinimum"].get<int64_t>() + 1);
    return lo + static_cast<int64_t>(rng() % (hi - lo + 1));
  }
  if (type == "number") {
    if (!s.contains("minimum") && !s.contains("maximum") && pick(3) == 0) return Json::parse("-1.5e-7");
    const int64_t lo = s.value("minimum", -100), hi = s.value("maximum", 100);
    const int64_t i = lo + static_cast<int64_t>(rng() % (hi - lo + 1));
    return i < hi && pick(2) ? Json(static_cast<double>(i) + 0.25) : Json(i);
  }
  if (type == "object") {
    Json o = Json::object();
    const Json props = s.value("properties", Json::object());
    std::vector<std::string> req = s.value("required", std::vector<std::string>());
    for (const auto& [k, sub] : props.items()) {
      if (std::find(req.begin(), req.end(), k) != req.end() || (!deep && pick(2))) {
        o[k] = Instance(sub, root, rng, depth + 1);
      }
    }
    if (s.contains("additionalProperties") && s["additionalProperties"] != false && pick(2)) {
      o["extra"] = Instance(s["additionalProperties"], root, rng, depth + 1);
    }
    return o;
  }
  Json a = Json::array();
  const size_t k = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
  const size_t lo = s.value("minItems", 0);
  size_t hi = s.value("maxItems", static_cast<int>(lo) + 3);
  if (!s.contains("items")) hi = std::min(hi, k);
  const size_t n = deep ? lo : lo + rng() % (hi - lo + 1);
  for (size_t i = 0; i < n; ++i) a.push_back(Instance(i < k ? s["prefixItems"][i] : s["items"], root, rng, depth + 1));
  return a;
}

// JSON text with ", " and ": " separators (Python's json.dumps) or none.
inline std::string Dump(const Json& v, bool spaced) {
  if (!spaced) return v.dump();
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      out += (first ? "" : ", ") + Json(k).dump() + ": " + Dump(x, true);
      first = false;
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + Dump(v[i], true);
    return out + "]";
  }
  return v.dump();
}

}  // namespace chunkattn::grammar::schema_gen

#endif  // CHUNKATTN_TEXT_TESTS_GRAMMAR_SCHEMA_GEN_H_
