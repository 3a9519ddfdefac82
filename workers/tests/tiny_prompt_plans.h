// Plans for one prompt on the tiny model (tiny_model.h): its prefill over a
// path of pool chunks and a decode step after it. The KV tier tests run them
// to check that chunks moved out and back decode as before, so they share
// one prompt shape here.
#ifndef CHUNKATTN_WORKERS_TESTS_TINY_PROMPT_PLANS_H_
#define CHUNKATTN_WORKERS_TESTS_TINY_PROMPT_PLANS_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "proto/plan/step_plan.h"
#include "workers/model/context_builder.h"
#include "workers/tests/tiny_model.h"

namespace chunkattn::testing {

// Tokens of the prompt: two full chunks and 5 tokens of a third.
inline constexpr int kTinyPromptLen = 2 * kTinyChunkSize + 5;

// The prompt (kTinyPromptLen random tokens below the vocabulary's 97) over
// the chunks of `path` (3 of them), prefilled from token 0: step 1.
inline StepPlan TinyPromptPrefill(std::mt19937_64& rng, const std::vector<int32_t>& path) {
  StepPlan plan;
  plan.step = 1;
  for (int i = 0; i < kTinyPromptLen; ++i) plan.tokens.push_back(static_cast<int32_t>(rng() % 97));
  plan.prefill.prefix_len = {0};
  plan.prefill.q_begin = {0, kTinyPromptLen};
  plan.prefill.chunk_begin = {0, static_cast<int32_t>(path.size())};
  plan.prefill.chunk_ids = path;
  return plan;
}

// One decode token after the prompt over `path`, its logits computed;
// `with_context` sends the path's decode context (the first decode; later
// steps reuse it).
inline StepPlan TinyPromptDecode(uint64_t step, const std::vector<int32_t>& path, bool with_context) {
  StepPlan plan;
  plan.step = step;
  plan.tokens = {11};
  if (with_context) {
    absl::StatusOr<ChunkContext> ctx = BuildChunkContext({path}, {kTinyPromptLen + 1}, kTinyChunkSize, 1);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    plan.has_context = true;
    if (ctx.ok()) plan.context = *ctx;
  }
  plan.has_decode = true;
  plan.seq_len = {kTinyPromptLen + 1};
  plan.logits_rows = {0};
  return plan;
}

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_WORKERS_TESTS_TINY_PROMPT_PLANS_H_
