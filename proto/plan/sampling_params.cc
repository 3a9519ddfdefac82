#include "proto/plan/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace chunkattn {

std::optional<SamplingParamsError> CheckSamplingParams(const SamplingParams& params) {
  using Field = SamplingParamsError::Field;
  if (!(params.temperature >= 0 && std::isfinite(params.temperature))) {
    return SamplingParamsError{Field::kTemperature,
                               absl::StrFormat("must be >= 0 and finite, got %g", params.temperature)};
  }
  if (params.top_k < 0) {
    return SamplingParamsError{Field::kTopK, absl::StrFormat("must be >= 0 (0 = off), got %d", params.top_k)};
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) {
    return SamplingParamsError{Field::kTopP, absl::StrFormat("must be in (0, 1], got %g", params.top_p)};
  }
  if (!(params.min_p >= 0 && params.min_p <= 1)) {
    return SamplingParamsError{Field::kMinP, absl::StrFormat("must be in [0, 1], got %g", params.min_p)};
  }
  if (!(params.repetition_penalty > 0 && std::isfinite(params.repetition_penalty))) {
    return SamplingParamsError{Field::kRepetitionPenalty,
                               absl::StrFormat("must be > 0 and finite, got %g", params.repetition_penalty)};
  }
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs) {
    return SamplingParamsError{Field::kTopLogprobs,
                               absl::StrFormat("must be in [0, %d], got %d", kMaxTopLogprobs, params.top_logprobs)};
  }
  return std::nullopt;
}

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  std::optional<SamplingParamsError> error = CheckSamplingParams(params);
  if (!error.has_value()) return absl::OkStatus();
  const char* name = "";
  switch (error->field) {
    case SamplingParamsError::Field::kTemperature:
      name = "temperature";
      break;
    case SamplingParamsError::Field::kTopK:
      name = "top_k";
      break;
    case SamplingParamsError::Field::kTopP:
      name = "top_p";
      break;
    case SamplingParamsError::Field::kMinP:
      name = "min_p";
      break;
    case SamplingParamsError::Field::kRepetitionPenalty:
      name = "repetition_penalty";
      break;
    case SamplingParamsError::Field::kTopLogprobs:
      name = "top_logprobs";
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(name, " ", error->rule));
}

}  // namespace chunkattn
