// Token sampling from the model's last-position logits, with Hugging Face /
// vLLM semantics: repetition penalty, then greedy or temperature, top-k, top-p
// and min-p, then one random draw.
//
// Reproducibility: a sequence's draw depends only on its own logits row,
// params, history, seed and step (a counter-based hash, no hidden RNG state),
// so the same seed gives the same tokens whatever else is in the batch, in
// whatever order, on whichever thread, and after a worker restart.
//
// Thread-compatible: a Sampler only keeps scratch buffers reused across calls,
// so use one Sampler per thread (or serialize calls on one).
#ifndef CHUNKATTN_WORKERS_SAMPLER_SAMPLER_H_
#define CHUNKATTN_WORKERS_SAMPLER_SAMPLER_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/plan/sampling_params.h"

namespace chunkattn {

// One sequence of a Sample() batch. Borrowed for the duration of the call.
struct SampleInput {
  const SamplingParams* params = nullptr;
  // Tokens seen so far (prompt + generated), for the repetition penalty; read
  // only when params->repetition_penalty != 1. Duplicates count once.
  absl::Span<const int32_t> history;
  // Index of the token being generated (0 for the first). Must differ between
  // steps of one sequence: (seed, step) names the draw.
  uint64_t step = 0;
  // The tokens this draw may take (structured outputs): token t when bit
  // t % 32 of word t / 32 is set; tokens past the words are not allowed.
  // Empty: every token. At most (vocab + 31) / 32 words.
  absl::Span<const uint32_t> allowed;
};

// The most likely tokens of a logits row, most likely first: a fixed array
// so that results stay allocation-free.
struct TopTokens {
  int32_t size = 0;  // entries in use, <= kMaxTopLogprobs
  std::array<int32_t, kMaxTopLogprobs> ids{};
  std::array<float, kMaxTopLogprobs> logprobs{};  // as SampleResult::logprob
};

struct SampleResult {
  int32_t token = 0;
  // Log-softmax of the raw logits (before penalty, temperature and filters;
  // disallowed tokens at -inf, so over the tokens the draw could take) at
  // `token`, in nats: what an OpenAI-style "logprobs" reports.
  float logprob = 0;
  // The min(params->top_logprobs, vocab) tokens of largest raw logit (ties to
  // the lower id; NaN and disallowed tokens as -inf), with logprobs computed
  // as `logprob` is, so `token`'s entry, when it has one, equals `logprob`.
  // Of the masked row, as `logprob`: a constrained sample reports the
  // distribution it drew from, and a disallowed token ranks as -inf. Empty
  // when top_logprobs is 0.
  TopTokens top;
};

// TopTokens of `n` entries (min(n, vocab)) for the raw logits row
// row[0, vocab) under the token mask `allowed` (SampleInput::allowed), as
// Sampler fills SampleResult::top; the one implementation, also the host
// fallback of the GPU samplers. Returns false, with out->size == 0, for a row
// Sampler refuses (an allowed +inf logit, or no allowed finite one).
// REQUIRES: vocab > 0, 0 <= n <= kMaxTopLogprobs, ValidateAllowedTokens ok.
// Cost: two streaming passes over the row (log-sum-exp, then an n-entry
// heap), O(vocab log n).
bool TopLogprobsOfRow(const float* row, int vocab, absl::Span<const uint32_t> allowed, int n, TopTokens* out);

// INVALID_ARGUMENT unless the token mask `allowed` (SampleInput::allowed)
// fits a vocabulary of `vocab` tokens: at most (vocab + 31) / 32 words. The
// message names no sequence; callers prefix theirs.
absl::Status ValidateAllowedTokens(absl::Span<const uint32_t> allowed, int vocab);
// Whether `allowed` lets some token of [0, vocab) through (an empty mask
// does). A mask that allows none leaves every row without a finite logit,
// which Sampler refuses as it refuses any such row: callers that would
// rather refuse the input up front (a plan from the network) ask this.
bool AllowsSomeToken(absl::Span<const uint32_t> allowed, int vocab);

// The uniform draw in [0, 1) (53 random bits) for step `step` of a sequence
// seeded `seed`: a SplitMix64-style hash of both, so any step is reachable
// without running the earlier ones. Exposed for tests and for other draws
// that must stay in lockstep with the sampler.
double UniformForStep(uint64_t seed, uint64_t step);

// exp(x) as the sampler computes its weights (about 2 ulp, 0 below -87.3 and
// for NaN). Exposed so tests can hold the GPU sampler's scalar copy
// (kernels/cuda/sample_row.h) to the same bits.
float SamplerExp(float x);

class Sampler {
 public:
  Sampler() = default;
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Picks one token per sequence.
  //   logits: (inputs.size(), vocab) fp32, row s for inputs[s]
  //   out:    (inputs.size())
  // Per sequence, in this order:
  //  1. NaN logits, and those of tokens outside a non-empty `allowed`,
  //     count as -inf: everything below sees the masked row. A +inf logit
  //     (of an allowed token), or a row with no finite logit, is
  //     INVALID_ARGUMENT.
  //  2. Repetition penalty p over the distinct tokens of history:
  //     logit > 0 -> logit / p, else logit * p; a finite result that
  //     overflows is clamped to +-FLT_MAX, so no penalty fails a row.
  //  3. temperature == 0 or top_k == 1: argmax, ties to the lowest token id;
  //     top_p and min_p are ignored. One pass over the row.
  //  4. Otherwise logits / temperature, then top-k (ties at the cut go to the
  //     lower id), then top-p (the smallest set of most likely tokens whose
  //     probability, renormalized after top-k, sums to >= top_p), then min-p
  //     (relative to the most likely token, which always survives), then one
  //     draw by inverse CDF with UniformForStep(seed, step) over the kept
  //     tokens in token-id order.
  //  5. If params->top_logprobs > 0, SampleResult::top from the raw row
  //     under the mask of 1.
  // Cost: one streaming pass over the row (vectorized exp) for greedy, a
  // mask read alongside (each block masked into an L1 buffer); for sampling
  // a few more passes, a one-scan heap for top-k <= 1024 and a radix select
  // for top-p: O(vocab), never a full sort; top_logprobs adds one pass. No
  // allocation once the scratch has grown to vocab.
  // Errors (INVALID_ARGUMENT; per-sequence ones name the sequence): vocab <= 0,
  // logits.size() != inputs.size() * vocab, out.size() != inputs.size(), a
  // null or invalid params, a history token outside [0, vocab) while the
  // penalty is on, an `allowed` of more than (vocab + 31) / 32 words, or a
  // bad row as in 1. On error `out` is partly written.
  absl::Status Sample(absl::Span<const float> logits, int vocab,
                      absl::Span<const SampleInput> inputs, absl::Span<SampleResult> out);

 private:
  struct Candidate {
    float w;     // unnormalized probability in [0, 1]; the most likely token has 1
    int32_t id;  // token id
  };

  absl::Status SampleOne(const float* row, int vocab, const SampleInput& input, int seq,
                         SampleResult* result);
  // The k best of w[0, n) (0 < k < n) into *top, in no particular order.
  void TopK(const float* w, int n, int k, std::vector<Candidate>* top);
  // Leaves in kept_ (token-id order) the nucleus of w[0, vocab) if `dense`,
  // else of kept_.
  void TopP(const float* w, int vocab, bool dense, float top_p);
  // The last candidate, in rank order, of the smallest head of sel_ whose
  // weight sums to >= target; reorders sel_.
  Candidate WeightedCut(double target);

  // Scratch, grown to vocab and then reused.
  std::vector<float> weights_;       // (vocab) the row's sanitized logits, then weights
  std::vector<Candidate> kept_;      // survivors of the cuts, token-id order
  std::vector<Candidate> sel_;       // selection workspace
  std::vector<double> bucket_mass_;  // top-p weight histogram
  // (vocab) 1 for the current sequence's history tokens, else 0; all 0
  // between calls, so only history entries are touched per sequence.
  std::vector<uint8_t> marks_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SAMPLER_SAMPLER_H_
