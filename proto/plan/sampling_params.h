// How a request's tokens are drawn: set by the API front, carried by the step
// plan to the worker that samples (CPU Sampler or GPU sampler).
#ifndef CHUNKATTN_PROTO_PLAN_SAMPLING_PARAMS_H_
#define CHUNKATTN_PROTO_PLAN_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace chunkattn {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy (argmax); else logits are divided by it
  int32_t top_k = 0;                // keep the k most likely tokens; 0 = off
  float top_p = 1.0f;               // nucleus mass in (0, 1]; 1 = off
  float min_p = 0.0f;               // drop tokens with prob < min_p * max prob; in [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1 = off (HF/CTRL style, see Sampler)
  // With the step index, fixes the random draw. The sampler gives no default
  // randomness: requests without a seed must be given a fresh one upstream.
  uint64_t seed = 0;
  // For the front end: whether to return SampleResult::logprob to the client.
  // The sampler fills logprob always (it costs nothing extra).
  bool return_logprobs = false;
  // How many of the most likely tokens (with their logprobs) to report with
  // each sample, in [0, kMaxTopLogprobs]; 0 = none. Unlike return_logprobs it
  // reaches the sampler: only it sees the whole row.
  int32_t top_logprobs = 0;
};

// OpenAI's bound on top_logprobs.
inline constexpr int32_t kMaxTopLogprobs = 20;

// The first field out of its range above (or not finite), and the rule it
// breaks ("must be in (0, 1], got 0"): for callers that name the field in
// their own terms (the coordinator's fronts).
struct SamplingParamsError {
  enum class Field { kTemperature, kTopK, kTopP, kMinP, kRepetitionPenalty, kTopLogprobs };
  Field field;
  std::string rule;
};
std::optional<SamplingParamsError> CheckSamplingParams(const SamplingParams& params);

// CheckSamplingParams as INVALID_ARGUMENT naming the field as this struct does.
absl::Status ValidateSamplingParams(const SamplingParams& params);

}  // namespace chunkattn

#endif  // CHUNKATTN_PROTO_PLAN_SAMPLING_PARAMS_H_
