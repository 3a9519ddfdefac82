// A step's token masks computed for several samples at once (the engine's
// mask pool, SchedulerOptions::mask_pool) equal the same masks computed one
// after another: two requests sharing one compiled grammar (and the shared
// position cache), n = 4 samples each, one of them completing within its
// budget (Spell walks its matcher), along seeded random walks. Under TSan
// (label unit_tsan) this is the race check of the parallel path.
#include "services/coordinator/grammar_constraint.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "text/grammar/compiled_grammar.h"
#include "text/grammar/vocabulary.h"

namespace chunkattn {
namespace {

std::shared_ptr<const grammar::Vocabulary> TestVocabulary() {
  std::vector<std::string> tokens;
  for (char c = 0x20; c < 0x7f; ++c) tokens.push_back(std::string(1, c));
  for (const char* t : {"\"name\"", "\": ", "\"tags\"", "\"n\"", "true", "null", "12", "ab", "{\"", "\"}", "\", \"",
                        "\\u00", "],"}) {
    tokens.push_back(t);
  }
  tokens.push_back("</s>");
  std::vector<bool> control(tokens.size(), false);
  control.back() = true;
  auto vocab = grammar::Vocabulary::FromTokens(tokens, control, {static_cast<int32_t>(tokens.size() - 1)});
  EXPECT_TRUE(vocab.ok()) << vocab.status();
  return *vocab;
}

TEST(GrammarConstraintTest, MasksOnAPoolEqualMasksOneAfterAnother) {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12},
      "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 3},
      "n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": false})";
  grammar::JsonSchemaOptions json_options;
  grammar::Limits limits;
  auto g = grammar::ConstraintGrammar({grammar::ConstraintKind::kJsonSchema, schema}, json_options, limits);
  ASSERT_TRUE(g.ok()) << g.status();
  auto compiled = grammar::CompiledGrammar::Compile(*g, TestVocabulary(), limits);
  ASSERT_TRUE(compiled.ok()) << compiled.status();

  constexpr int kSamples = 4;
  constexpr int kBudget = 60;
  // Each request twice: one computes on the pool, its twin serially.
  struct Pair {
    std::unique_ptr<GrammarConstraint> pooled, serial;
  };
  std::vector<Pair> requests;
  for (bool complete_within_budget : {false, true}) {
    requests.push_back({std::make_unique<GrammarConstraint>(*compiled, kSamples, complete_within_budget),
                        std::make_unique<GrammarConstraint>(*compiled, kSamples, complete_within_budget)});
  }
  const int words = requests[0].pooled->mask_words();
  const int vocab = (*compiled)->vocab()->vocab_size();
  ThreadPool pool(4);
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    if (seed > 1) {  // fresh matchers for the next walk
      for (Pair& p : requests) {
        const bool complete = &p == &requests[1];
        p.pooled = std::make_unique<GrammarConstraint>(*compiled, kSamples, complete);
        p.serial = std::make_unique<GrammarConstraint>(*compiled, kSamples, complete);
      }
    }
    const int jobs = static_cast<int>(requests.size()) * kSamples;
    std::vector<bool> ended(jobs, false);
    for (int step = 0; step < kBudget; ++step) {
      std::vector<std::vector<uint32_t>> pooled(jobs, std::vector<uint32_t>(words)), serial = pooled;
      std::vector<int> ok_pooled(jobs, 0), ok_serial(jobs, 0);
      pool.ParallelFor(jobs, [&](int64_t k, int /*thread*/) {
        if (ended[k]) return;
        ok_pooled[k] = requests[k / kSamples].pooled->FillNextTokenMask(static_cast<int32_t>(k % kSamples),
                                                                        kBudget - step, absl::MakeSpan(pooled[k]));
      });
      for (int k = 0; k < jobs; ++k) {
        if (ended[k]) continue;
        ok_serial[k] = requests[k / kSamples].serial->FillNextTokenMask(k % kSamples, kBudget - step,
                                                                        absl::MakeSpan(serial[k]));
      }
      EXPECT_EQ(ok_pooled, ok_serial) << "seed " << seed << " step " << step;
      EXPECT_EQ(pooled, serial) << "seed " << seed << " step " << step;
      // Each sample draws one allowed token (the same in both twins).
      for (int k = 0; k < jobs; ++k) {
        if (ended[k]) continue;
        if (!ok_serial[k]) {
          ended[k] = true;
          continue;
        }
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocab; ++t) {
          if ((serial[k][t / 32] >> (t % 32)) & 1u) allowed.push_back(t);
        }
        ASSERT_FALSE(allowed.empty());
        const int32_t token = allowed[rng() % allowed.size()];
        const bool a = requests[k / kSamples].pooled->Accept(k % kSamples, token);
        const bool b = requests[k / kSamples].serial->Accept(k % kSamples, token);
        ASSERT_EQ(a, b);
        ended[k] = a;
      }
    }
    // The request completing within its budget ended every sample in it.
    for (int k = kSamples; k < 2 * kSamples; ++k) EXPECT_TRUE(ended[k]) << "seed " << seed << " sample " << k;
  }
}

}  // namespace
}  // namespace chunkattn
