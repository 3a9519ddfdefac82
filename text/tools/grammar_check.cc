// chunkattn-grammar-check: the grammar engine's verdicts, byte by byte, for
// a differential test against another engine (tests/text/xgrammar_reference,
// tests/text/test_xgrammar_differential.py). Reads JSON lines on stdin, one
// grammar each, and writes one JSON line per input line (flushed, so a test
// may drive it line by line):
//
//   in:  {"kind": "json_schema" | "regex" | "ebnf" | "json_object" | "choice",
//         "grammar": "...",                // choice: an array of strings; json_object: ignored
//         "strings": ["text" | {"hex": "..."}, ...],
//         "whitespace": "flexible",        // json kinds: or "compact" (JsonWhitespace)
//         "max_whitespace": 16,            // json kinds, flexible: bytes per gap
//         "strict": true,                  // json_schema: JsonSchemaOptions::strict
//         "sample": 0, "seed": 0,          // that many random accepted strings
//         "max_len": 256,                  // a sample's bytes before it is steered to an end
//         "avoid": [13]}                   // bytes a sample takes only when nothing else may follow
//   out: {"results": [{"prefix": bool, "complete": bool, "accepted_bytes": n}, ...],
//         "samples": ["text" | {"hex": "..."}, ...], "compile_ms": x}
//        or {"error": "..."} when the request or its grammar is invalid.
//
// prefix: every byte was accepted (the string is a prefix of a match);
// complete: prefix and the whole string is a match; accepted_bytes: how many
// leading bytes were accepted one at a time (GrammarMatcher::AcceptBytes).
//
// A sample is a random walk over the bytes the token mask allows (the
// grammar compiled for a vocabulary of the 256 single bytes plus a stop
// token): printable ASCII, other ASCII and non-ASCII bytes weighted 70:15:15
// so that structure is not drowned in multi-byte characters; where the
// output is complete the walk stops with probability 1/4, and past max_len
// bytes it ends with ShortestCompletion(). Every chosen byte must pass
// AcceptBytes too and the stop bit must equal IsCompleted(): a mask that
// disagrees is reported as an error, not sampled past.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/grammar/compiled_grammar.h"
#include "text/grammar/grammar.h"
#include "text/grammar/matcher.h"
#include "text/grammar/vocabulary.h"
#include "text/utf8.h"

namespace {

using chunkattn::grammar::CompiledGrammar;
using chunkattn::grammar::Constraint;
using chunkattn::grammar::ConstraintKind;
using chunkattn::grammar::GrammarMatcher;
using chunkattn::grammar::JsonSchemaOptions;
using chunkattn::grammar::JsonWhitespace;
using chunkattn::grammar::Vocabulary;
// Ordered: a JSON Schema sent as an object keeps its properties' order.
using Json = nlohmann::ordered_json;

constexpr int32_t kStopToken = 256;
constexpr int64_t kMaxSamples = 100'000;
constexpr int64_t kMaxSampleLen = 1 << 20;

// Tokens 0..255: the single bytes; 256: the stop token.
std::shared_ptr<const Vocabulary> ByteVocabulary() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  tokens.push_back("</s>");
  std::vector<bool> control(tokens.size(), false);
  control[kStopToken] = true;
  auto vocab = Vocabulary::FromTokens(std::move(tokens), std::move(control), {kStopToken});
  if (!vocab.ok()) {
    std::cerr << "byte vocabulary: " << vocab.status() << '\n';
    std::abort();
  }
  return *vocab;
}

// A string entry: JSON text (UTF-8) or {"hex": "..."} for any bytes.
absl::StatusOr<std::string> DecodeString(const Json& entry) {
  if (entry.is_string()) return entry.get<std::string>();
  if (!entry.is_object() || !entry.contains("hex") || !entry["hex"].is_string()) {
    return absl::InvalidArgumentError("a string must be text or {\"hex\": \"...\"}");
  }
  const std::string hex = entry["hex"].get<std::string>();
  if (hex.size() % 2 != 0) return absl::InvalidArgumentError("odd-length hex string");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = chunkattn::grammar::HexValue(hex[i]), lo = chunkattn::grammar::HexValue(hex[i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError("bad hex digit");
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

Json EncodeString(const std::string& s) {
  if (chunkattn::IsValidUtf8(s)) return s;
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : s) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 15]);
  }
  return Json{{"hex", hex}};
}

absl::StatusOr<Constraint> ParseConstraint(const Json& req) {
  if (!req.contains("kind") || !req["kind"].is_string()) return absl::InvalidArgumentError("missing \"kind\"");
  const std::string kind = req["kind"].get<std::string>();
  Constraint c;
  if (kind == "json_object") {
    c.kind = ConstraintKind::kJsonObject;
    return c;
  }
  if (kind == "choice") {
    c.kind = ConstraintKind::kChoice;
    if (!req.contains("grammar") || !req["grammar"].is_array()) {
      return absl::InvalidArgumentError("choice: \"grammar\" must be an array of strings");
    }
    c.text = req["grammar"].dump();
    return c;
  }
  if (kind == "json_schema") c.kind = ConstraintKind::kJsonSchema;
  else if (kind == "regex") c.kind = ConstraintKind::kRegex;
  else if (kind == "ebnf") c.kind = ConstraintKind::kGrammar;
  else return absl::InvalidArgumentError(absl::StrCat("unknown kind \"", kind, "\""));
  if (!req.contains("grammar")) return absl::InvalidArgumentError("missing \"grammar\"");
  // A JSON Schema may come as an object; the others are text.
  if (c.kind == ConstraintKind::kJsonSchema && !req["grammar"].is_string()) {
    c.text = req["grammar"].dump();
  } else if (req["grammar"].is_string()) {
    c.text = req["grammar"].get<std::string>();
  } else {
    return absl::InvalidArgumentError("\"grammar\" must be a string");
  }
  return c;
}

// req[key] as an integer in [lo, hi], `dflt` when absent.
absl::StatusOr<int64_t> IntField(const Json& req, const char* key, int64_t dflt, int64_t lo, int64_t hi) {
  if (!req.contains(key)) return dflt;
  const Json& v = req[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an integer in [", lo, ", ", hi, "]"));
  }
  return v.get<int64_t>();
}

absl::StatusOr<JsonSchemaOptions> ParseOptions(const Json& req) {
  JsonSchemaOptions o;
  o.whitespace = JsonWhitespace::kFlexible;
  if (req.contains("whitespace")) {
    const Json& ws = req["whitespace"];
    if (ws == "compact") o.whitespace = JsonWhitespace::kCompact;
    else if (ws != "flexible") return absl::InvalidArgumentError("\"whitespace\" must be flexible or compact");
  }
  ASSIGN_OR_RETURN(const int64_t max_whitespace, IntField(req, "max_whitespace", 16, 0, 1000));
  o.max_whitespace = static_cast<int32_t>(max_whitespace);
  if (req.contains("strict")) {
    if (!req["strict"].is_boolean()) return absl::InvalidArgumentError("\"strict\" must be true or false");
    o.strict = req["strict"].get<bool>();
  }
  return o;
}

Json Verdict(const std::shared_ptr<const CompiledGrammar>& compiled, const std::string& s) {
  GrammarMatcher m(compiled);
  size_t n = 0;
  while (n < s.size() && m.AcceptBytes(std::string_view(s).substr(n, 1))) ++n;
  const bool prefix = n == s.size();
  Json r = {{"prefix", prefix}, {"complete", prefix && m.IsCompleted()}, {"accepted_bytes", n}};
  if (!m.status().ok()) r["error"] = m.status().ToString();
  return r;
}

// One random accepted string into *out; false with *why when the engine
// contradicts itself (see the file comment) or the walk is stuck.
bool Sample(const std::shared_ptr<const CompiledGrammar>& compiled, std::mt19937_64& rng, int64_t max_len,
            const std::vector<bool>& avoid, std::string* out, std::string* why) {
  GrammarMatcher m(compiled);
  std::vector<uint32_t> mask(compiled->vocab()->bitmask_words());
  std::string s;
  std::uniform_real_distribution<double> unit(0, 1);
  while (true) {
    if (m.IsCompleted() && (!m.CanContinue() || unit(rng) < 0.25)) break;
    if (static_cast<int64_t>(s.size()) >= max_len) {
      const std::string rest = m.ShortestCompletion();
      if (!m.AcceptBytes(rest) || !m.IsCompleted()) {
        *why = absl::StrCat("ShortestCompletion() after ", s.size(), " bytes did not complete the match");
        return false;
      }
      s += rest;
      break;
    }
    const auto filled = m.FillNextTokenBitmask(absl::MakeSpan(mask));
    if (!filled.ok()) {
      *why = filled.ToString();
      return false;
    }
    const bool stop_bit = (mask[kStopToken / 32] >> (kStopToken % 32)) & 1;
    if (stop_bit != m.IsCompleted()) {
      *why = absl::StrCat("the stop token's mask bit is ", stop_bit, " but IsCompleted() is ", m.IsCompleted(),
                          " after ", s.size(), " bytes");
      return false;
    }
    std::vector<int> groups[3];  // printable ASCII, other ASCII, non-ASCII
    std::vector<int> avoided;
    for (int b = 0; b < 256; ++b) {
      if (!((mask[b / 32] >> (b % 32)) & 1)) continue;
      if (avoid[b]) avoided.push_back(b);
      else groups[b >= 0x80 ? 2 : (b >= 0x20 && b < 0x7F) ? 0 : 1].push_back(b);
    }
    if (groups[0].empty() && groups[1].empty() && groups[2].empty()) groups[1] = avoided;
    double weights[3] = {groups[0].empty() ? 0.0 : 0.70, groups[1].empty() ? 0.0 : 0.15,
                         groups[2].empty() ? 0.0 : 0.15};
    if (weights[0] + weights[1] + weights[2] == 0) {
      if (m.IsCompleted()) break;
      *why = absl::StrCat("no byte may follow and the output is not complete after ", s.size(), " bytes");
      return false;
    }
    const int g = std::discrete_distribution<int>(weights, weights + 3)(rng);
    const int b = groups[g][std::uniform_int_distribution<size_t>(0, groups[g].size() - 1)(rng)];
    const char c = static_cast<char>(b);
    if (!m.AcceptBytes(std::string_view(&c, 1))) {
      *why = absl::StrCat("the mask allows byte ", b, " after ", s.size(), " bytes but AcceptBytes refuses it");
      return false;
    }
    s.push_back(c);
  }
  *out = std::move(s);
  return true;
}

// The last kCacheSize compiled grammars by request key, most recent last: a
// test asks for samples of a batch of grammars, then for their verdicts.
constexpr size_t kCacheSize = 32;
using Cache = std::vector<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>>;

// The answer to one request line.
Json Handle(const std::string& line, const std::shared_ptr<const Vocabulary>& vocab, Cache* cache) {
  const Json req = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (req.is_discarded() || !req.is_object()) return Json{{"error", "bad request: not a JSON object"}};
  auto constraint = ParseConstraint(req);
  if (!constraint.ok()) return Json{{"error", absl::StrCat("bad request: ", constraint.status().message())}};
  auto options = ParseOptions(req);
  if (!options.ok()) return Json{{"error", absl::StrCat("bad request: ", options.status().message())}};
  std::vector<std::string> strings;
  if (req.contains("strings")) {
    if (!req["strings"].is_array()) return Json{{"error", "bad request: \"strings\" must be an array"}};
    for (const Json& entry : req["strings"]) {
      auto s = DecodeString(entry);
      if (!s.ok()) return Json{{"error", absl::StrCat("bad request: ", s.status().message())}};
      strings.push_back(*std::move(s));
    }
  }
  auto sample_count = IntField(req, "sample", 0, 0, kMaxSamples);
  auto seed = IntField(req, "seed", 0, 0, INT64_MAX);
  auto max_len = IntField(req, "max_len", 256, 0, kMaxSampleLen);
  for (const auto* field : {&sample_count, &seed, &max_len}) {
    if (!field->ok()) return Json{{"error", absl::StrCat("bad request: ", field->status().message())}};
  }
  std::vector<bool> avoid(256, false);
  if (req.contains("avoid")) {
    if (!req["avoid"].is_array()) return Json{{"error", "bad request: \"avoid\" must be an array of bytes"}};
    for (const Json& b : req["avoid"]) {
      if (!b.is_number_integer() || b.get<int64_t>() < 0 || b.get<int64_t>() > 255) {
        return Json{{"error", "bad request: \"avoid\" must be an array of bytes"}};
      }
      avoid[b.get<int64_t>()] = true;
    }
  }

  const std::string key = Json{constraint->kind, constraint->text, options->whitespace == JsonWhitespace::kCompact,
                               options->max_whitespace, options->strict}
                              .dump();
  const auto start = std::chrono::steady_clock::now();
  auto hit = std::find_if(cache->begin(), cache->end(), [&](const auto& e) { return e.first == key; });
  if (hit != cache->end()) {
    std::rotate(hit, hit + 1, cache->end());
  } else {
    auto compiled = chunkattn::grammar::CompileConstraint(*constraint, vocab, *options);
    if (!compiled.ok()) return Json{{"error", compiled.status().ToString()}};
    if (cache->size() == kCacheSize) cache->erase(cache->begin());
    cache->emplace_back(key, *std::move(compiled));
  }
  const std::shared_ptr<const CompiledGrammar>& grammar = cache->back().second;
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  Json results = Json::array();
  for (const std::string& s : strings) results.push_back(Verdict(grammar, s));
  Json samples = Json::array();
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  for (int64_t i = 0; i < *sample_count; ++i) {
    std::string s, why;
    if (!Sample(grammar, rng, *max_len, avoid, &s, &why)) {
      return Json{{"error", absl::StrCat("sample ", i, ": ", why)}};
    }
    samples.push_back(EncodeString(s));
  }
  return Json{{"results", results}, {"samples", samples}, {"compile_ms", compile_ms}};
}

}  // namespace

int main() {
  const std::shared_ptr<const Vocabulary> vocab = ByteVocabulary();
  Cache cache;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json out;
    try {
      out = Handle(line, vocab, &cache);
    } catch (const std::exception& e) {  // nlohmann's, on input no check above foresaw
      out = Json{{"error", absl::StrCat("internal: ", e.what())}};
    }
    std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
  }
  return 0;
}
