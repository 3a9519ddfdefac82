// What every Generate front's fuzzer checks of a request it let through:
// it can be served without harming anyone else. Its prompt fits the
// vocabulary and the context, and its sampling parameters sample a token
// from any finite logits (a penalty that overflowed a logit once failed
// every request in flight: finding 1 of the reliability issue).
#ifndef CHUNKATTN_TESTS_FUZZ_ACCEPTED_REQUEST_H_
#define CHUNKATTN_TESTS_FUZZ_ACCEPTED_REQUEST_H_

#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "proto/model/model_config.h"
#include "tests/fuzz/fuzz_util.h"
#include "services/coordinator/engine.h"
#include "workers/sampler/sampler.h"

namespace chunkattn::fuzz {

// Fails (aborts, naming `harness`) unless `valid` is servable; the logits
// sampled from are drawn from the input's bytes, extremes included.
inline void CheckAcceptedRequest(const char* harness, const EngineRequest& valid, const ModelConfig& config,
                                 const uint8_t* data, size_t size) {
  const RequestSpec& spec = valid.spec;
  if (spec.prompt.empty()) Fail(harness, "accepted an empty prompt");
  for (int32_t t : spec.prompt) {
    if (t < 0 || t >= config.vocab_size) Fail(harness, "accepted a prompt token outside the vocabulary");
  }
  if (static_cast<int64_t>(spec.prompt.size()) + spec.max_new_tokens > config.max_context ||
      spec.max_new_tokens < 1) {
    Fail(harness, "accepted a request that cannot fit the context");
  }
  if (spec.n < 1) Fail(harness, "accepted n < 1");

  const int vocab = config.vocab_size;
  std::vector<float> logits(vocab);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  const float extremes[] = {0.f, -0.f, 1e-38f, -1e-38f, 3e38f, -3e38f, 88.f, -88.f, 1e-45f};
  for (int v = 0; v < vocab; ++v) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    logits[v] = (h >> 60) == 0 ? extremes[(h >> 32) % std::size(extremes)]
                               : static_cast<float>(static_cast<int32_t>(h >> 32)) * 1e-8f;
  }
  Sampler sampler;
  SampleInput input;
  input.params = &spec.sampling;
  input.history = spec.prompt;
  std::vector<SampleResult> out(1);
  for (uint64_t step = 0; step < 2; ++step) {
    input.step = step;
    const absl::Status sampled = sampler.Sample(logits, vocab, {&input, 1}, absl::MakeSpan(out));
    if (!sampled.ok()) Fail(harness, "an accepted request cannot be sampled: " + sampled.ToString());
    if (out[0].token < 0 || out[0].token >= vocab) Fail(harness, "sampled a token outside the vocabulary");
    if (std::isnan(out[0].logprob)) Fail(harness, "a NaN logprob");
    // The scheduler splits the worker's entries by the accepted top_logprobs.
    if (out[0].top.size != spec.sampling.top_logprobs) {
      Fail(harness, "an accepted top_logprobs the sampler does not fill");
    }
  }
}

}  // namespace chunkattn::fuzz

#endif  // CHUNKATTN_TESTS_FUZZ_ACCEPTED_REQUEST_H_
