// JSON Schema constraints against an independent reference: seeded random
// schemas; instances generated from the schema by this file (not by the
// grammar) must be accepted; whatever the matcher accepts as complete (edited
// instances, random walks over the grammar's own bytes finished by the
// shortest completion) must parse with nlohmann::json and pass this file's
// validator.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sanitizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/grammar/json_schema.h"
#include "text/grammar/matcher.h"
#include "text/tests/grammar_schema_gen.h"

namespace chunkattn::grammar {
namespace {

using schema_gen::Dump;
using schema_gen::Instance;
using schema_gen::Json;
using schema_gen::RandomSchema;
using schema_gen::Valid;

const char* kTree = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
    "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},"required":["v"]}},"$ref":"#/$defs/node"})";

// Whatever the matcher accepts as complete parses and validates.
void ExpectSound(const std::string& text, const Json& schema, const std::string& what) {
  const Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << what << ": accepted text is not JSON: " << text;
  ASSERT_TRUE(Valid(schema, parsed, schema)) << what << ": accepted text does not validate: " << text;
}

TEST(GrammarJsonSchema, RandomSchemasAgainstReferenceValidator) {
  std::mt19937 rng(424242);
  int accepted_walks = 0;
  // Fewer under a sanitizer (its build looks for memory errors; the plain build checks all 250).
  constexpr int kRounds = SanitizerSlice(250, 5);
  for (int round = 0; round < kRounds; ++round) {
    const Json schema = round % 10 == 9 ? Json::parse(kTree) : RandomSchema(rng, 3);
    JsonSchemaOptions options;
    const bool pretty = round % 5 == 4;
    if (pretty) {
      options.whitespace = JsonWhitespace::kFlexible;
      options.max_whitespace = 64;  // nlohmann indents 2 a level
    }
    const std::string what = absl::StrCat("schema ", schema.dump());
    auto g = JsonSchemaToGrammar(schema.dump(), options);
    ASSERT_TRUE(g.ok()) << what << ": " << g.status();
    auto compiled = CompiledGrammar::Compile(*g, nullptr);
    ASSERT_TRUE(compiled.ok()) << what << ": " << compiled.status() << "\n" << g->ToString();
    for (int i = 0; i < 8; ++i) {
      const Json inst = Instance(schema, schema, rng);
      ASSERT_TRUE(Valid(schema, inst, schema)) << what << " generator bug: " << inst.dump();
      const std::string text = pretty ? inst.dump(2) : Dump(inst, i % 2 == 1);
      // Valid instances are accepted, every prefix on the way too.
      GrammarMatcher m(*compiled);
      for (size_t k = 0; k < text.size(); ++k) {
        ASSERT_TRUE(m.AcceptBytes(text.substr(k, 1))) << what << "\nrefused at byte " << k << " of " << text;
        // From a random prefix, the shortest completion finishes a valid value.
        if (rng() % 16 == 0) {
          GrammarMatcher copy = m;
          const std::string done = copy.ShortestCompletion();
          ASSERT_TRUE(copy.AcceptBytes(done) && copy.IsCompleted()) << what << " completing " << text.substr(0, k + 1);
          ExpectSound(text.substr(0, k + 1) + done, schema, what + " (shortest completion)");
        }
      }
      ASSERT_TRUE(m.IsCompleted()) << what << "\nnot complete: " << text;
      // Edited instances: accepted only when still valid.
      for (int e = 0; e < 6; ++e) {
        std::string edited = text;
        static const std::vector<std::string> bits = {"\"", "1", "-", ",", "}", "]", "a", " ", "e", ".", "0", "null"};
        const size_t at = rng() % (edited.size() + 1);
        switch (rng() % 3) {
          case 0: edited.insert(at, bits[rng() % bits.size()]); break;
          case 1: if (at < edited.size()) edited.erase(at, 1 + rng() % 3); break;
          default: if (at < edited.size()) edited.replace(at, 1, bits[rng() % bits.size()]); break;
        }
        GrammarMatcher em(*compiled);
        if (em.AcceptBytes(edited) && em.IsCompleted()) ExpectSound(edited, schema, what + " (edited)");
      }
    }
    // Random walks over the grammar's own bytes, finished by the shortest
    // completion.
    for (int walk = 0; walk < 6; ++walk) {
      GrammarMatcher m(*compiled);
      std::string text;
      const size_t len = rng() % 40;
      while (text.size() < len && m.CanContinue()) {
        std::vector<int> bytes;
        for (int b = 0; b < 256; ++b) {
          if (m.AcceptBytes(std::string(1, static_cast<char>(b)))) {
            bytes.push_back(b);
            m.Rollback(1);
          }
        }
        ASSERT_FALSE(bytes.empty()) << what << " stuck after " << text;
        const char b = static_cast<char>(bytes[rng() % bytes.size()]);
        ASSERT_TRUE(m.AcceptBytes(std::string(1, b)));
        text += b;
      }
      const std::string done = m.ShortestCompletion();
      ASSERT_TRUE(m.AcceptBytes(done) && m.IsCompleted()) << what << " completing " << text;
      ExpectSound(text + done, schema, what + " (walk)");
      ++accepted_walks;
    }
  }
  EXPECT_GT(accepted_walks, kRounds * 4);  // the walks ran (6 a round)
}

TEST(GrammarJsonSchema, ExactShapes) {
  struct Case {
    const char* schema;
    std::vector<const char*> yes, no;
  };
  const std::vector<Case> cases = {
      {R"({"type":"integer","minimum":-15,"maximum":1234})", {"-15", "0", "9", "1234", "999"}, {"-16", "1235", "01", "-0", "1.0"}},
      {R"({"type":"integer","exclusiveMinimum":0})", {"1", "100000000000"}, {"0", "-1"}},
      {R"({"type":"number","minimum":0,"maximum":1})", {"0", "0.5", "1", "1.000"}, {"1.01", "-0.5", "2", "1e0"}},
      {R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("a\n")", R"("\ud83d\ude00é")"}, {R"("a")", R"("abcd")"}},
      {R"({"type":"string","pattern":"^a\"b$"})", {R"("a\"b")"}, {R"("a"b")", R"("ab")"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["b"]})",
       {R"({"b":1})", R"({"a":1, "b":2})", R"({"a": 1,"b": 2})"}, {R"({"a":1})", R"({"b":1,"a":2})", R"({})", R"({ "b":1})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
       {R"({"a":1,"b":true})", R"({"c":false})", R"({"ab":true})"}, {R"({"a":true})", R"({"a":1,"a":true})"}},
      {R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"minItems":1})",
       {"[1]", R"([1,"x"])"}, {"[]", R"([1,"x",2])", R"(["x"])"}},
      {R"({"type":"array","items":{"type":"null"},"minItems":2,"maxItems":3})", {"[null,null]", "[null, null, null]"},
       {"[null]", "[null,null,null,null]", "[]"}},
      {R"({"type":["string","null"],"nullable":true})", {"null", R"("x")"}, {"1"}},
      {R"({"$ref":"#"})", {"true", "[1]"}, {"tru"}},
      {R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("24-01-01")"}},
  };
  for (const Case& c : cases) {
    auto g = JsonSchemaToGrammar(c.schema);
    if (std::string(c.schema) == R"({"$ref":"#"})") {
      // A schema that is only a reference to itself never finishes.
      ASSERT_TRUE(g.ok());
      EXPECT_FALSE(CompiledGrammar::Compile(*g, nullptr).ok());
      continue;
    }
    ASSERT_TRUE(g.ok()) << c.schema << ": " << g.status();
    auto compiled = CompiledGrammar::Compile(*g, nullptr);
    ASSERT_TRUE(compiled.ok()) << c.schema << ": " << compiled.status();
    for (const char* s : c.yes) {
      GrammarMatcher m(*compiled);
      EXPECT_TRUE(m.AcceptBytes(s) && m.IsCompleted()) << c.schema << " should accept " << s;
    }
    for (const char* s : c.no) {
      GrammarMatcher m(*compiled);
      EXPECT_FALSE(m.AcceptBytes(s) && m.IsCompleted()) << c.schema << " should refuse " << s;
    }
  }
}

TEST(GrammarJsonSchema, JsonObjectAndChoice) {
  auto obj = CompiledGrammar::Compile(JsonObjectGrammar(), nullptr);
  ASSERT_TRUE(obj.ok());
  for (const char* s : {"{}", R"({"a": [1, {"b": null}], "c": -0.5e+3})"}) {
    GrammarMatcher m(*obj);
    EXPECT_TRUE(m.AcceptBytes(s) && m.IsCompleted()) << s;
  }
  for (const char* s : {"[]", "1", R"({"a"})", R"({"a":01})"}) {
    GrammarMatcher m(*obj);
    EXPECT_FALSE(m.AcceptBytes(s) && m.IsCompleted()) << s;
  }
  auto choice = ChoiceToGrammar({"yes", "no", "yes please"});
  ASSERT_TRUE(choice.ok());
  auto c = CompiledGrammar::Compile(*choice, nullptr);
  ASSERT_TRUE(c.ok());
  GrammarMatcher m(*c);
  ASSERT_TRUE(m.AcceptBytes("yes"));
  EXPECT_TRUE(m.IsCompleted());
  EXPECT_TRUE(m.CanContinue());
  EXPECT_TRUE(m.AcceptBytes(" please"));
  EXPECT_FALSE(m.CanContinue());
  EXPECT_FALSE(ChoiceToGrammar({}).ok());
}

}  // namespace
}  // namespace chunkattn::grammar
