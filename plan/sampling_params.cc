#include "plan/sampling_params.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace chunkattn {

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  if (!(params.temperature >= 0 && std::isfinite(params.temperature))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("temperature must be >= 0 and finite, got %g", params.temperature));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_k must be >= 0 (0 = off), got %d", params.top_k));
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrFormat("top_p must be in (0, 1], got %g", params.top_p));
  }
  if (!(params.min_p >= 0 && params.min_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrFormat("min_p must be in [0, 1], got %g", params.min_p));
  }
  if (!(params.repetition_penalty > 0 && std::isfinite(params.repetition_penalty))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "repetition_penalty must be > 0 and finite, got %g", params.repetition_penalty));
  }
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrFormat("top_logprobs must be in [0, %d], got %d",
                                                      kMaxTopLogprobs, params.top_logprobs));
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
