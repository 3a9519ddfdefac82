#include "workers/sampler/row_sampling.h"

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace chunkattn {

absl::Status PackMask(absl::Span<const uint32_t> allowed, int vocab, cuda::SampleRowParams* d, PackedSamples* out) {
  d->mask_begin = -1;
  d->mask_words = 0;
  if (allowed.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateAllowedTokens(allowed, vocab));
  if (out->masks.size() + allowed.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("the samples' token masks exceed 2^31 words");
  }
  d->mask_begin = static_cast<int32_t>(out->masks.size());
  d->mask_words = static_cast<int32_t>(allowed.size());
  out->masks.insert(out->masks.end(), allowed.begin(), allowed.end());
  return absl::OkStatus();
}

absl::Status PackSamples(absl::Span<const int32_t> rows, absl::Span<const SampleInput> inputs, int vocab,
                         int64_t num_rows, PackedSamples* out) {
  if (rows.size() != inputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d sample rows for %d sample inputs", rows.size(), inputs.size()));
  }
  if (vocab <= 0 || vocab > cuda::kMaxSampleVocab) {
    return absl::InvalidArgumentError(
        absl::StrFormat("vocab must be in [1, %d] to sample on the device, got %d", cuda::kMaxSampleVocab, vocab));
  }
  out->params.resize(inputs.size());
  out->top_logprobs.assign(inputs.size(), 0);
  out->history.clear();
  out->penalized = false;
  out->masks.clear();
  for (size_t s = 0; s < inputs.size(); ++s) {
    const SampleInput& in = inputs[s];
    if (rows[s] < 0 || rows[s] >= num_rows) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sample %d names logits row %d of %d", s, rows[s], num_rows));
    }
    if (in.params == nullptr) return absl::InvalidArgumentError(absl::StrFormat("sample %d: params is null", s));
    if (absl::Status status = ValidateSamplingParams(*in.params); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("sample %d: %s", s, status.message()));
    }
    const SamplingParams& p = *in.params;
    cuda::SampleRowParams& d = out->params[s];
    d = cuda::SampleRowParams();
    d.row = rows[s];
    d.temperature = p.temperature;
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    d.min_p = p.min_p;
    d.penalty = p.repetition_penalty;
    d.u = UniformForStep(p.seed, in.step);
    out->top_logprobs[s] = p.top_logprobs;
    if (absl::Status status = PackMask(in.allowed, vocab, &d, out); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("sample %d: %s", s, status.message()));
    }
    if (p.repetition_penalty == 1.0f) continue;
    out->penalized = true;
    if (out->history.size() + in.history.size() > static_cast<size_t>(INT32_MAX)) {
      return absl::InvalidArgumentError("the samples' histories exceed 2^31 tokens");
    }
    d.history_begin = static_cast<int32_t>(out->history.size());
    for (const int32_t t : in.history) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrFormat("sample %d: history token %d outside [0, %d)", s, t, vocab));
      }
      out->history.push_back(t);
    }
    d.history_end = static_cast<int32_t>(out->history.size());
  }
  return absl::OkStatus();
}

void SampleRowsOnHost(absl::Span<const float> logits, int vocab, const PackedSamples& packed,
                      absl::Span<SampleResult> out) {
  for (size_t s = 0; s < packed.params.size(); ++s) {
    const cuda::SampleRowParams& p = packed.params[s];
    const float* row = logits.data() + static_cast<size_t>(p.row) * vocab;
    const cuda::SampleRowResult r = cuda::SampleRowOnHost(row, vocab, p, packed.history.data(), packed.masks.data());
    out[s].token = r.token;
    out[s].logprob = r.logprob;
    out[s].top.size = 0;
    if (r.token >= 0) {
      absl::Span<const uint32_t> allowed;
      if (p.mask_begin >= 0) allowed = absl::MakeConstSpan(packed.masks.data() + p.mask_begin, p.mask_words);
      AddTopLogprobs(row, vocab, allowed, packed.top_logprobs[s], &out[s]);
    }
  }
}

void AddTopLogprobs(const float* row, int vocab, absl::Span<const uint32_t> allowed, int n, SampleResult* out) {
  out->top.size = 0;
  if (n <= 0 || !TopLogprobsOfRow(row, vocab, allowed, n, &out->top)) return;
  for (int j = 0; j < out->top.size; ++j) {
    if (out->top.ids[j] == out->token) out->logprob = out->top.logprobs[j];
  }
}

}  // namespace chunkattn
