// The host side of the GPU sampler (LaunchSample, kernels/cuda/layers.h):
// Sampler inputs checked and packed into the per-sample records the device
// reads, and the same row algorithm (kernels/cuda/sample_row.h) run on the
// host. The latter is how that algorithm is tested against the Sampler on a
// machine without a GPU, and how CPU stand-ins of GPU models sample.
//
// Thread-compatible: free functions over caller-owned data.
#ifndef CHUNKATTN_WORKERS_SAMPLER_ROW_SAMPLING_H_
#define CHUNKATTN_WORKERS_SAMPLER_ROW_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cuda/sample_row.h"
#include "workers/sampler/sampler.h"

namespace chunkattn {

struct PackedSamples {
  std::vector<cuda::SampleRowParams> params;  // one per sample, in order
  std::vector<int32_t> history;               // the penalized samples' histories, concatenated
  bool penalized = false;                     // whether any sample has a penalty (the device needs marks)
  std::vector<uint32_t> masks;                // the constrained samples' token masks, concatenated
  // Per sample, its params' top_logprobs: the device sampler computes none,
  // so these rows' logits also go to the host (AddTopLogprobs).
  std::vector<int32_t> top_logprobs;
};

// Sample s draws from logits row rows[s] of (num_rows, vocab) with inputs[s].
// INVALID_ARGUMENT (naming the sample) as Sampler::Sample would for its
// inputs, and for a row outside [0, num_rows); `out` is then unspecified.
absl::Status PackSamples(absl::Span<const int32_t> rows, absl::Span<const SampleInput> inputs, int vocab,
                         int64_t num_rows, PackedSamples* out);

// Packs a token mask `allowed` (SampleInput::allowed; empty: none) for the
// sample whose record is `d`, appending its words to out->masks, as
// PackSamples does for the masks in its inputs. INVALID_ARGUMENT (not naming
// the sample) as Sampler::Sample would for the mask. For masks that come
// after PackSamples (Model::ForwardSample's late masks).
absl::Status PackMask(absl::Span<const uint32_t> allowed, int vocab, cuda::SampleRowParams* d, PackedSamples* out);

// The GPU's algorithm on the host, with AddTopLogprobs where asked.
// logits: (num_rows, vocab) with the rows PackSamples checked; out:
// (params.size()), token -1 for a row with a +inf logit or no finite logit.
void SampleRowsOnHost(absl::Span<const float> logits, int vocab, const PackedSamples& packed,
                      absl::Span<SampleResult> out);

// The host fallback for top_logprobs of a device sampler, which returns only
// the token and its logprob: out->top from the sample's raw logits row under
// its token mask `allowed` (the Sampler's own TopLogprobsOfRow), and
// out->logprob replaced by the token's entry when it has one, so the two
// agree exactly as they do in the Sampler (the device's log-sum-exp rounds
// differently). out->top is empty for n == 0.
void AddTopLogprobs(const float* row, int vocab, absl::Span<const uint32_t> allowed, int n, SampleResult* out);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SAMPLER_ROW_SAMPLING_H_
