// The public Generate request from arbitrary bytes, as gRPC would hand it
// over: parsed, then ValidateGenerateRequest accepts it or refuses it with
// INVALID_ARGUMENT, never crashes. What it accepts must be servable without
// harming anyone else: its prompt fits the vocabulary and the context, and
// its sampling parameters sample a token from any finite logits (a penalty
// that overflowed a logit once failed every request in flight: finding 1 of
// the reliability issue).
//
// The config is the tiny model's, without a tokenizer: text prompts are
// checked up to tokenization (bounds, emptiness). SentencePiece cannot load
// in a sanitizer build beside libprotobuf (text/spm_loader.cc); tokenizers
// of our own get their own harness.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chunkattn/v1/generation.pb.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/proto_mutator.h"
#include "services/coordinator/generation_service.h"
#include "workers/sampler/sampler.h"
#include "workers/tests/tiny_model.h"

namespace {

using chunkattn::fuzz::Fail;

const chunkattn::ModelConfig& Config() {
  static const chunkattn::ModelConfig config = chunkattn::testing::TinyConfig();
  return config;
}

}  // namespace

// Mostly one field changed through reflection (proto_mutator.h).
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937_64 rng(seed);
  chunkattn::v1::GenerateRequest request;
  if (rng() % 5 == 0 || !request.ParseFromArray(data, static_cast<int>(size))) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  chunkattn::fuzz::MutateMessage(&request, rng);
  return chunkattn::fuzz::ReplaceInput(request.SerializeAsString(), data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chunkattn::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;  // gRPC refuses it before us
  auto valid = chunkattn::ValidateGenerateRequest(request, Config(), chunkattn::PromptText{}, /*seed=*/42);
  if (!valid.ok()) {
    if (valid.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("generate_request_fuzz", "refused with " + valid.status().ToString() + " instead of INVALID_ARGUMENT");
    }
    return 0;
  }
  const chunkattn::RequestSpec& spec = valid->spec;
  if (spec.prompt.empty()) Fail("generate_request_fuzz", "accepted an empty prompt");
  for (int32_t t : spec.prompt) {
    if (t < 0 || t >= Config().vocab_size) {
      Fail("generate_request_fuzz", "accepted a prompt token outside the vocabulary");
    }
  }
  if (static_cast<int64_t>(spec.prompt.size()) + spec.max_new_tokens > Config().max_context ||
      spec.max_new_tokens < 1) {
    Fail("generate_request_fuzz", "accepted a request that cannot fit the context");
  }
  if (spec.n < 1) Fail("generate_request_fuzz", "accepted n < 1");

  // Logits the model could produce, drawn from the input: extremes included.
  const int vocab = Config().vocab_size;
  std::vector<float> logits(vocab);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  const float extremes[] = {0.f, -0.f, 1e-38f, -1e-38f, 3e38f, -3e38f, 88.f, -88.f, 1e-45f};
  for (int v = 0; v < vocab; ++v) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    logits[v] = (h >> 60) == 0 ? extremes[(h >> 32) % std::size(extremes)]
                               : static_cast<float>(static_cast<int32_t>(h >> 32)) * 1e-8f;
  }
  chunkattn::Sampler sampler;
  chunkattn::SampleInput input;
  input.params = &spec.sampling;
  input.history = spec.prompt;
  std::vector<chunkattn::SampleResult> out(1);
  for (uint64_t step = 0; step < 2; ++step) {
    input.step = step;
    const absl::Status sampled = sampler.Sample(logits, vocab, {&input, 1}, absl::MakeSpan(out));
    if (!sampled.ok()) Fail("generate_request_fuzz", "an accepted request cannot be sampled: " + sampled.ToString());
    if (out[0].token < 0 || out[0].token >= vocab) {
      Fail("generate_request_fuzz", "sampled a token outside the vocabulary");
    }
    if (std::isnan(out[0].logprob)) Fail("generate_request_fuzz", "a NaN logprob");
    // The scheduler splits the worker's entries by the accepted top_logprobs.
    if (out[0].top.size != spec.sampling.top_logprobs) {
      Fail("generate_request_fuzz", "an accepted top_logprobs the sampler does not fill");
    }
  }
  return 0;
}
