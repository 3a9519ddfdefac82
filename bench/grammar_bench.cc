// chunkattn-grammar-bench: the structured-output engine's cost on a real
// vocabulary (Qwen3's, 151k tokens, by default): for a few typical tool-call
// JSON schemas and json_object mode, the compile time (constraint text to
// masks ready, no cache) and the time to fill one token mask, per token, while
// the matcher follows a valid output tokenized by the tokenizer itself.
// Reports the median and p99 over all tokens of all outputs, and the compile
// medians over `--repeats` compiles: cold (every position classified) and
// warm (positions shared with earlier compiles on the vocabulary, such as the
// JSON string rule, from the process-wide cache). Single-threaded.
//
//   chunkattn-grammar-bench [--tokenizer path/to/tokenizer.json] [--json out.json]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/percentile.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "text/grammar/matcher.h"
#include "text/hf_tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json (default: Qwen3's from scripts/install-hf-reference.sh's cache)");
ABSL_FLAG(int, repeats, 5, "compiles per schema");
ABSL_FLAG(int, passes, 3, "times each output is replayed for mask timings");
ABSL_FLAG(std::string, json, "", "write the results here");

namespace chunkattn {
namespace {

using grammar::CompiledGrammar;
using grammar::Constraint;
using grammar::ConstraintKind;
using grammar::GrammarMatcher;

struct Case {
  const char* name;
  ConstraintKind kind;
  const char* schema;
  std::vector<const char*> outputs;  // valid outputs, replayed token by token
};

std::vector<Case> Cases() {
  return {
      {"get_weather", ConstraintKind::kJsonSchema,
       R"({"type":"object","properties":{"location":{"type":"string","description":"City and country"},
           "unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"],
           "additionalProperties":false})",
       {R"({"location": "Paris, France", "unit": "celsius"})", R"({"location":"San Francisco, CA"})",
        R"({"location": "東京", "unit": "fahrenheit"})"}},
      {"web_search", ConstraintKind::kJsonSchema,
       R"({"type":"object","properties":{"query":{"type":"string"},
           "max_results":{"type":"integer","minimum":1,"maximum":50},
           "filters":{"type":"object","properties":{"site":{"type":"string"},"after":{"type":"string","format":"date"}},
                      "additionalProperties":false}},"required":["query"],"additionalProperties":false})",
       {R"({"query": "latest results of the 2024 chess olympiad", "max_results": 10, "filters": {"site": "fide.com", "after": "2024-09-01"}})",
        R"({"query": "how to \"escape\" quotes in JSON?\nAnd newlines"})"}},
      {"create_event", ConstraintKind::kJsonSchema,
       R"({"type":"object","properties":{"title":{"type":"string"},"start":{"type":"string","format":"date-time"},
           "duration_minutes":{"type":"integer","minimum":0},
           "attendees":{"type":"array","items":{"type":"object","properties":{"email":{"type":"string"},
                        "optional":{"type":"boolean"}},"required":["email"],"additionalProperties":false},"maxItems":20},
           "location":{"anyOf":[{"type":"string"},{"type":"null"}]},
           "priority":{"enum":["low","normal","high"]}},
           "required":["title","start","attendees"],"additionalProperties":false})",
       {R"({"title": "Quarterly planning", "start": "2025-03-14T09:30:00Z", "duration_minutes": 90, "attendees": [{"email": "ana@example.com"}, {"email": "bo@example.com", "optional": true}], "location": null, "priority": "high"})",
        R"({"title":"Lunch","start":"2025-01-02T12:00:00+01:00","attendees":[],"location":"Café de Flore"})"}},
      {"tool_call_any_of", ConstraintKind::kJsonSchema,
       R"({"anyOf":[
           {"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object",
             "properties":{"location":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]}},"required":["location"],
             "additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false},
           {"type":"object","properties":{"name":{"const":"send_email"},"arguments":{"type":"object",
             "properties":{"to":{"type":"array","items":{"type":"string"},"minItems":1},"subject":{"type":"string"},
             "body":{"type":"string"},"cc":{"type":"array","items":{"type":"string"}}},"required":["to","subject","body"],
             "additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false}]})",
       {R"({"name": "send_email", "arguments": {"to": ["team@example.com"], "subject": "Release 1.4", "body": "Hi all,\n\nThe release is out. Notes: https://example.com/notes\n\nThanks!"}})",
        R"({"name": "get_weather", "arguments": {"location": "Berlin"}})"}},
      // Length-bounded strings: chains of 33 and 129 counts of each string
      // state, classified one chain template at a time (compiled_grammar.h).
      {"bounded_strings", ConstraintKind::kJsonSchema,
       R"({"type":"object","properties":{"name":{"type":"string","maxLength":32},
           "bio":{"type":"string","minLength":1,"maxLength":128}},"required":["name","bio"],"additionalProperties":false})",
       {R"({"name": "Ada Lovelace", "bio": "Mathematician; wrote the first published algorithm for a machine."})"}},
      {"json_object", ConstraintKind::kJsonObject, "",
       {R"({"answer": 42, "reasons": ["a", "b"], "nested": {"ok": true, "x": -1.5e3, "none": null}})"}},
  };
}

double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int Main(int argc, char** argv) {
  std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) path = bench::FindQwen3Tokenizer();
  if (path.empty()) {
    std::fprintf(stderr, "no --tokenizer and no Qwen3 tokenizer.json: run scripts/install-hf-reference.sh\n");
    return 2;
  }
  auto tok = LoadHfTokenizer(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto vocab = grammar::Vocabulary::Create(**tok);
  if (!vocab.ok()) {
    std::fprintf(stderr, "%s\n", std::string(vocab.status().message()).c_str());
    return 2;
  }
  const double vocab_ms = Ms(std::chrono::steady_clock::now() - t0);
  std::printf("tokenizer %s: %d tokens, trie %zu nodes, built in %.1f ms\n", path.c_str(), (*vocab)->vocab_size(),
              (*vocab)->trie().size(), vocab_ms);
  std::printf("%-18s %8s %8s %9s %10s %8s %9s %9s %9s %7s\n", "schema", "cold_ms", "warm_ms", "positions",
              "trie_steps", "uncert", "mask_p50", "mask_p99", "mask_max", "tokens");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> all_us;
  std::vector<uint32_t> mask((*vocab)->bitmask_words());
  for (const Case& c : Cases()) {
    // Cold: every position classified here. Warm: positions shared with
    // earlier compiles on this vocabulary come from the process-wide cache
    // (the steady state of a server; the first compile is the cold one).
    std::vector<double> cold_ms, compile_ms;
    std::shared_ptr<const CompiledGrammar> compiled;
    for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
      for (bool shared : {false, true}) {
        auto s = std::chrono::steady_clock::now();
        auto g = grammar::ConstraintGrammar(Constraint{c.kind, c.schema}, grammar::JsonSchemaOptions(),
                                            grammar::Limits());
        absl::StatusOr<std::shared_ptr<const CompiledGrammar>> cg =
            g.ok() ? CompiledGrammar::Compile(*g, *vocab, grammar::Limits(), shared) : g.status();
        (shared ? compile_ms : cold_ms).push_back(Ms(std::chrono::steady_clock::now() - s));
        if (!cg.ok()) {
          std::fprintf(stderr, "%s: %s\n", c.name, std::string(cg.status().message()).c_str());
          return 1;
        }
        compiled = *cg;
      }
    }
    std::vector<double> us;
    for (int pass = 0; pass < absl::GetFlag(FLAGS_passes); ++pass) {
      for (const char* output : c.outputs) {
        auto ids = (*tok)->Encode(output, /*add_bos=*/false);
        if (!ids.ok()) return 1;
        GrammarMatcher m(compiled);
        std::vector<int32_t> seq = *ids;
        seq.push_back((*vocab)->stop_ids()[0]);
        for (int32_t id : seq) {
          auto s = std::chrono::steady_clock::now();
          (void)m.FillNextTokenBitmask(absl::MakeSpan(mask));
          us.push_back(Ms(std::chrono::steady_clock::now() - s) * 1000);
          if (!(mask[id >> 5] >> (id & 31) & 1) || !m.AcceptToken(id)) {
            std::fprintf(stderr, "%s: token %d of %s refused\n", c.name, id, output);
            return 1;
          }
        }
      }
    }
    all_us.insert(all_us.end(), us.begin(), us.end());
    const auto& st = compiled->stats();
    std::printf("%-18s %8.2f %8.2f %9d %10lld %8lld %9.1f %9.1f %9.1f %7zu\n", c.name, Median(cold_ms),
                Median(compile_ms), st.positions,
                static_cast<long long>(st.work), static_cast<long long>(st.uncertain_tokens), Median(us), Percentile(us, 99),
                *std::max_element(us.begin(), us.end()), us.size());
    nlohmann::json row = bench::Provenance(argc, argv);
    row["schema"] = c.name;
    row["vocab_size"] = (*vocab)->vocab_size();
    row["compile_cold_ms_median"] = Median(cold_ms);
    row["compile_ms_median"] = Median(compile_ms);
    row["positions"] = st.positions;
    row["uncertain_tokens"] = st.uncertain_tokens;
    row["trie_steps"] = st.work;
    row["mask_us_median"] = Median(us);
    row["mask_us_p99"] = Percentile(us, 99);
    row["mask_us_max"] = *std::max_element(us.begin(), us.end());
    row["tokens"] = us.size();
    rows.push_back(row);
  }
  std::printf("all tokens: mask median %.1f us, p99 %.1f us (%zu masks)\n", Median(all_us), Percentile(all_us, 99),
              all_us.size());
  if (!absl::GetFlag(FLAGS_json).empty()) {
    bench::JsonArrayFile out(absl::GetFlag(FLAGS_json));
    for (auto& row : rows) out.Append(row);
  }
  return 0;
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return chunkattn::Main(argc, argv);
}
