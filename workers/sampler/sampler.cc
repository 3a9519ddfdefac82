#include "workers/sampler/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "base/hash.h"
#include "base/status_macros.h"

namespace chunkattn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows are streamed in blocks of this many floats (4 KiB): each block is read
// from memory once and its sub-passes (max, exp-sum, copy) hit L1.
constexpr int kBlock = 1024;
// Top-k by a k-entry heap in one scan up to this k, by nth_element above it.
constexpr int kMaxHeapK = 1024;
// Top-p bisects by nth_element down to this many candidates, then sorts.
constexpr int kSortBelow = 256;
// Top-p over the whole vocabulary first buckets the weights by their top
// float bits: 8 exponent + 4 mantissa bits, 1/16 of an octave per bucket.
// Weights are in [0, 1], so their bits are below 0x3F800001 and rank like
// the floats.
constexpr int kBucketShift = 19;
constexpr int kNumBuckets = (0x3F800000 >> kBucketShift) + 1;

// Four floats in GCC/Clang vector extensions: SSE2 on x86-64, NEON on Arm,
// no ISA flags needed. `<` and `?:` work lane-wise.
using Float4 = float __attribute__((vector_size(16)));
using Int4 = int32_t __attribute__((vector_size(16)));

inline Float4 Splat(float x) { return Float4{} + x; }
// Loads min(n, 4) floats, the missing lanes set to `fill`.
inline Float4 Load4(const float* p, int n, float fill) {
  Float4 v;
  if (n >= 4) {
    std::memcpy(&v, p, sizeof v);
  } else {
    v = Splat(fill);
    for (int i = 0; i < n; ++i) v[i] = p[i];
  }
  return v;
}
inline void Store4(float* p, int n, Float4 v) {
  if (n >= 4) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (int i = 0; i < n; ++i) p[i] = v[i];
  }
}
inline float HMax(Float4 v) { return std::max(std::max(v[0], v[1]), std::max(v[2], v[3])); }

// exp(x) to about 2 ulp for x <= 88; exactly 0 below -87.3 and for NaN, and
// exactly 1 at 0. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then
// Cephes' degree-6 polynomial; n is rounded with the 1.5 * 2^23 trick, which
// needs no SSE4.1. Every lane (and every tail) goes through this one function
// so equal logits always get bit-equal weights (ties stay ties).
inline Float4 Exp4(Float4 x) {
  const Float4 lo = Splat(-87.3f), hi = Splat(88.3f);
  const auto in_range = x >= lo;  // false for NaN
  Float4 c = in_range ? x : lo;
  c = c > hi ? hi : c;
  const Float4 magic = Splat(12582912.0f);
  const Float4 n = (c * 1.44269504088896341f + magic) - magic;
  Float4 r = c - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Float4 p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const Int4 bits = (__builtin_convertvector(n, Int4) + 127) << 23;
  Float4 scale;  // 2^n
  std::memcpy(&scale, &bits, sizeof scale);
  const Float4 e = p * scale;
  return in_range ? e : Float4{};
}

// Max of p[0, n); NaN never wins a `>`, so it counts as -inf.
float MaxOf(const float* p, int64_t n) {
  Float4 m = Splat(-kInf);
  for (int64_t i = 0; i < n; i += 4) {
    const Float4 x = Load4(p + i, static_cast<int>(std::min<int64_t>(4, n - i)), -kInf);
    m = x > m ? x : m;
  }
  return HMax(m);
}

// Running log-sum-exp of a row with NaN as -inf: log(sum) + max. max stays
// -inf while no finite logit was seen and becomes +inf on a +inf logit (the
// caller rejects that row, so sum is then meaningless).
struct LogSumExp {
  float max = -kInf;
  double sum = 0;

  // Adds p[0, n) whose maximum is `block_max`.
  void AddBlock(const float* p, int n, float block_max) {
    if (!(block_max > max)) {
      if (max == -kInf) return;  // nothing finite yet, nor in this block
    } else {
      sum *= std::exp(double{max} - block_max);  // 0 when max was -inf
      max = block_max;
      if (max == kInf) return;
    }
    const Float4 m = Splat(max);
    Float4 acc0{}, acc1{};  // two chains hide the add latency
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      acc0 += Exp4(Load4(p + i, 4, 0) - m);
      acc1 += Exp4(Load4(p + i + 4, 4, 0) - m);
    }
    for (; i < n; i += 4) acc0 += Exp4(Load4(p + i, n - i, -kInf) - m);
    const Float4 acc = acc0 + acc1;
    sum += double{acc[0]} + acc[1] + acc[2] + acc[3];
  }
  // log softmax(x) for a finite logit x of the row.
  float LogProb(float x) const { return static_cast<float>(double{x} - max - std::log(sum)); }
};

// HF RepetitionPenaltyLogitsProcessor: torch.where(score < 0, score * p, score / p).
// A finite logit stays finite: a tiny or huge penalty would otherwise turn it
// into +-inf and fail the row (one request's parameters must never fail a
// step). -inf (and NaN, sanitized to it) stays -inf.
inline float Penalize(float x, float penalty) {
  const float y = x < 0 ? x * penalty : x / penalty;
  return std::isinf(y) && !std::isinf(x) ? std::copysign(std::numeric_limits<float>::max(), y) : y;
}
inline float SanitizeNaN(float x) { return std::isnan(x) ? -kInf : x; }

// SampleInput::allowed over a row. Every pass reads the row through it a
// block at a time, so a masked row is read exactly as a row whose disallowed
// logits were -inf: the same bits come out either way.
struct TokenMask {
  absl::Span<const uint32_t> words;  // empty: every token allowed

  bool Allows(int t) const {
    const size_t w = static_cast<size_t>(t) / 32;
    return words.empty() || (w < words.size() && ((words[w] >> (t % 32)) & 1u) != 0);
  }
  float At(const float* row, int t) const { return Allows(t) ? row[t] : -kInf; }
  // row[b, b + n) as the passes read it: in place without a mask, else
  // masked into out[0, n). REQUIRES: b % 32 == 0 (kBlock is a multiple).
  const float* Block(const float* row, int b, int n, float* out) const {
    if (words.empty()) return row + b;
    for (int j = 0; j < n; j += 32) {
      const size_t w = static_cast<size_t>(b + j) / 32;
      const uint32_t bits = w < words.size() ? words[w] : 0;
      const int m = std::min(32, n - j);
      for (int i = 0; i < m; ++i) out[j + i] = ((bits >> i) & 1u) != 0 ? row[b + j + i] : -kInf;
    }
    return out;
  }
};

// The greedy path's single pass: argmax of the penalized masked row (the
// first maximum, so ties go to the lowest id) and the masked row's
// log-sum-exp. Returns -1 if no logit is above -inf.
template <bool kPenalty>
int32_t GreedyScan(const float* row, int vocab, const TokenMask& mask, const uint8_t* marks, float penalty,
                   LogSumExp* lse) {
  float best = -kInf;
  int32_t best_id = -1;
  float masked[kBlock];  // a masked block, read back from L1
  for (int b = 0; b < vocab; b += kBlock) {
    const int n = std::min(kBlock, vocab - b);
    const float* p = mask.Block(row, b, n, masked);
    const float block_max = MaxOf(p, n);
    lse->AddBlock(p, n, block_max);
    if constexpr (kPenalty) {
      for (int i = 0; i < n; ++i) {
        const float x = SanitizeNaN(p[i]);
        const float y = marks[b + i] ? Penalize(x, penalty) : x;
        if (y > best) {
          best = y;
          best_id = b + i;
        }
      }
    } else if (block_max > best) {
      best = block_max;
      best_id = b + static_cast<int>(std::find(p, p + n, block_max) - p);
    }
  }
  return best_id;
}

// The sampling path's pass: the masked row's log-sum-exp, and the masked row
// with NaN as -inf copied to `y`.
void SanitizeScan(const float* row, int vocab, const TokenMask& mask, LogSumExp* lse, float* y) {
  for (int b = 0; b < vocab; b += kBlock) {
    const int n = std::min(kBlock, vocab - b);
    const float* p = mask.Block(row, b, n, y + b);  // masked into y, sanitized there below
    lse->AddBlock(p, n, MaxOf(p, n));
    for (int i = 0; i < n; i += 4) {
      const Float4 x = Load4(p + i, n - i, 0);
      Store4(y + b + i, n - i, x == x ? x : Splat(-kInf));
    }
  }
}

// w[i] = exp((y[i] - max) / temperature) in place: unnormalized
// probabilities, exactly 1 at the max. Shifting before dividing keeps tiny
// temperatures from overflowing.
void ToWeights(float* w, int64_t n, float max, float temperature) {
  const Float4 m = Splat(max), t = Splat(temperature);
  for (int64_t i = 0; i < n; i += 4) {
    const int lanes = static_cast<int>(std::min<int64_t>(4, n - i));
    Store4(w + i, lanes, Exp4((Load4(w + i, lanes, -kInf) - m) / t));
  }
}

// Sum of the w[i] >= min_w, in a fixed (lane-wise) order.
double SumAtLeast(const float* w, int64_t n, float min_w) {
  const Float4 lo = Splat(min_w);
  double sum = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min<int64_t>(n, b + kBlock);
    Float4 acc{};
    for (int64_t i = b; i < e; i += 4) {
      const Float4 x = Load4(w + i, static_cast<int>(std::min<int64_t>(4, e - i)), 0);
      acc += x >= lo ? x : Float4{};
    }
    sum += double{acc[0]} + acc[1] + acc[2] + acc[3];
  }
  return sum;
}

// Rank order of the top-k and top-p cuts: heavier first, ties to the lower id,
// so which tied token survives never depends on an algorithm's internal order.
// A function object (not a function pointer) so the std algorithms inline it.
struct RankOrder {
  template <typename Candidate>
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.w > b.w || (a.w == b.w && a.id < b.id);
  }
};
constexpr RankOrder RanksBefore;

// The n best raw logits of row[0, vocab) into *out, ranked as the cuts rank
// weights (larger first, ties to the lower id), NaN and disallowed tokens as
// -inf, with logprobs from `lse` (the masked row's, finite). Ranking by logit
// equals ranking by logprob: the logprob is the logit less one constant.
// REQUIRES: 0 < n.
void TopOfRow(const float* row, int vocab, const TokenMask& mask, int n, const LogSumExp& lse, TopTokens* out) {
  struct Entry {
    float w;  // the logit, NaN as -inf
    int32_t id;
  };
  std::array<Entry, kMaxTopLogprobs> heap;
  const int k = std::min(n, vocab);
  // A heap whose front is the worst entry so far. Later ids lose ties, so
  // a token enters only if strictly larger than the front (never a NaN).
  for (int i = 0; i < k; ++i) heap[i] = {SanitizeNaN(mask.At(row, i)), i};
  std::make_heap(heap.begin(), heap.begin() + k, RanksBefore);
  for (int i = k; i < vocab; ++i) {
    const float x = mask.At(row, i);
    if (x > heap[0].w) {
      std::pop_heap(heap.begin(), heap.begin() + k, RanksBefore);
      heap[k - 1] = {x, i};
      std::push_heap(heap.begin(), heap.begin() + k, RanksBefore);
    }
  }
  std::sort_heap(heap.begin(), heap.begin() + k, RanksBefore);  // best first
  out->size = k;
  for (int i = 0; i < k; ++i) {
    out->ids[i] = heap[i].id;
    out->logprobs[i] = lse.LogProb(heap[i].w);  // -inf stays -inf
  }
}

}  // namespace

bool TopLogprobsOfRow(const float* row, int vocab, absl::Span<const uint32_t> allowed, int n, TopTokens* out) {
  out->size = 0;
  // The log-sum-exp block by block as the Sampler's scans do it, so the
  // logprobs are bit-equal to the Sampler's.
  const TokenMask mask{allowed};
  LogSumExp lse;
  float masked[kBlock];
  for (int b = 0; b < vocab; b += kBlock) {
    const int m = std::min(kBlock, vocab - b);
    const float* p = mask.Block(row, b, m, masked);
    lse.AddBlock(p, m, MaxOf(p, m));
  }
  if (!std::isfinite(lse.max)) return false;
  if (n > 0) TopOfRow(row, vocab, mask, n, lse, out);
  return true;
}

absl::Status ValidateAllowedTokens(absl::Span<const uint32_t> allowed, int vocab) {
  const size_t words = (static_cast<size_t>(std::max(vocab, 0)) + 31) / 32;
  if (allowed.size() > words) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a token mask of %d words for a vocabulary of %d", allowed.size(), vocab));
  }
  return absl::OkStatus();
}

bool AllowsSomeToken(absl::Span<const uint32_t> allowed, int vocab) {
  if (allowed.empty()) return true;
  for (size_t w = 0; w < allowed.size() && static_cast<int64_t>(w) * 32 < vocab; ++w) {
    const int64_t past = vocab - static_cast<int64_t>(w) * 32;  // tokens of [0, vocab) in this word
    const uint32_t live = past >= 32 ? ~uint32_t{0} : (uint32_t{1} << past) - 1;
    if ((allowed[w] & live) != 0) return true;
  }
  return false;
}

double UniformForStep(uint64_t seed, uint64_t step) {
  // Mixing seed and step separately before combining keeps nearby pairs such
  // as (s, t+1) and (s+1, t) unrelated.
  const uint64_t h = Mix64(SplitMix64(seed) ^ Mix64(step + 0xD1B54A32D192ED03ull));
  return static_cast<double>(h >> 11) * 0x1.0p-53;  // the top 53 bits fill a mantissa
}

float SamplerExp(float x) { return Exp4(Splat(x))[0]; }

absl::Status Sampler::Sample(absl::Span<const float> logits, int vocab,
                             absl::Span<const SampleInput> inputs, absl::Span<SampleResult> out) {
  if (vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("vocab must be > 0, got %d", vocab));
  }
  if (logits.size() != inputs.size() * static_cast<size_t>(vocab)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logits has %d values, want num_seqs %d * vocab %d", logits.size(),
                        inputs.size(), vocab));
  }
  if (out.size() != inputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("out has %d entries, want num_seqs %d", out.size(), inputs.size()));
  }
  if (marks_.size() != static_cast<size_t>(vocab)) marks_.assign(vocab, 0);
  if (weights_.size() < static_cast<size_t>(vocab)) weights_.resize(vocab);
  for (size_t s = 0; s < inputs.size(); ++s) {
    RETURN_IF_ERROR(
        SampleOne(logits.data() + s * vocab, vocab, inputs[s], static_cast<int>(s), &out[s]));
  }
  return absl::OkStatus();
}

absl::Status Sampler::SampleOne(const float* row, int vocab, const SampleInput& input, int seq,
                                SampleResult* result) {
  if (input.params == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("sequence %d: params is null", seq));
  }
  const SamplingParams& params = *input.params;
  if (absl::Status status = ValidateSamplingParams(params); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("sequence %d: %s", seq, status.message()));
  }
  result->top.size = 0;
  if (absl::Status status = ValidateAllowedTokens(input.allowed, vocab); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("sequence %d: %s", seq, status.message()));
  }
  const TokenMask mask{input.allowed};
  const float penalty = params.repetition_penalty;
  const bool use_penalty = penalty != 1.0f;
  if (use_penalty) {
    for (const int32_t t : input.history) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrFormat("sequence %d: history token %d outside [0, %d)", seq, t, vocab));
      }
    }
  }
  auto bad_row = [seq](const LogSumExp& lse) -> absl::Status {
    if (lse.max == kInf) {
      return absl::InvalidArgumentError(absl::StrFormat("logits of sequence %d contain +inf", seq));
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("logits of sequence %d are all -inf or NaN", seq));
  };

  LogSumExp lse;
  if (params.temperature == 0 || params.top_k == 1) {
    int32_t token;
    if (use_penalty) {
      // Marks (rather than penalizing per history entry) make repeats count
      // once, as HF's gather/scatter does.
      for (const int32_t t : input.history) marks_[t] = 1;
      token = GreedyScan<true>(row, vocab, mask, marks_.data(), penalty, &lse);
      for (const int32_t t : input.history) marks_[t] = 0;
    } else {
      token = GreedyScan<false>(row, vocab, mask, nullptr, penalty, &lse);
    }
    if (token < 0 || !std::isfinite(lse.max)) return bad_row(lse);
    result->token = token;
    result->logprob = lse.LogProb(row[token]);
    if (params.top_logprobs > 0) TopOfRow(row, vocab, mask, params.top_logprobs, lse, &result->top);
    return absl::OkStatus();
  }

  float* const w = weights_.data();
  SanitizeScan(row, vocab, mask, &lse, w);
  if (!std::isfinite(lse.max)) return bad_row(lse);
  if (params.top_logprobs > 0) TopOfRow(row, vocab, mask, params.top_logprobs, lse, &result->top);
  float max_logit = lse.max;
  if (use_penalty) {
    // Recomputed from the row, so repeats are penalized once.
    for (const int32_t t : input.history) w[t] = Penalize(SanitizeNaN(mask.At(row, t)), penalty);
    max_logit = MaxOf(w, vocab);
    if (max_logit == -kInf) return bad_row(lse);
  }
  ToWeights(w, vocab, max_logit, params.temperature);

  // The candidates are all of w (dense) until a top-k or top-p cut lists the
  // survivors in kept_, always in token-id order. Cuts rank by weight, ties by
  // lower id; the most likely token (weight exactly 1) survives every cut.
  bool dense = true;
  if (params.top_k > 0 && params.top_k < vocab) {
    TopK(w, vocab, params.top_k, &kept_);
    std::sort(kept_.begin(), kept_.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
    dense = false;
  }
  if (params.top_p < 1.0f) {
    TopP(w, vocab, dense, params.top_p);
    dense = false;
  }
  const float min_w = params.min_p;  // p < min_p * p_max  <=>  w < min_p, as w_max == 1

  // Inverse CDF in token-id order: the draw depends on the kept distribution
  // alone, not on how the cuts happened to leave their arrays.
  const double u = UniformForStep(params.seed, input.step);
  int32_t token = -1;
  if (dense) {
    const double target = u * SumAtLeast(w, vocab, min_w);
    double cum = 0;
    for (int i = 0; i < vocab; ++i) {
      if (w[i] == 0 || w[i] < min_w) continue;
      token = i;
      cum += w[i];
      if (target < cum) break;
    }
  } else {
    double total = 0;
    for (const Candidate& c : kept_) total += c.w >= min_w ? c.w : 0;
    const double target = u * total;
    double cum = 0;
    for (const Candidate& c : kept_) {
      if (c.w == 0 || c.w < min_w) continue;
      token = c.id;
      cum += c.w;
      if (target < cum) break;
    }
  }
  // If rounding left target >= the final cum, the last candidate was taken.
  // None at all is left only when the penalty overflowed a logit to +inf.
  if (token < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d: the repetition penalty overflowed a logit", seq));
  }
  result->token = token;
  result->logprob = lse.LogProb(row[token]);
  return absl::OkStatus();
}

void Sampler::TopK(const float* w, int n, int k, std::vector<Candidate>* top) {
  top->clear();
  if (k <= kMaxHeapK) {
    // A heap whose front is the worst of the best k so far. Later ids lose
    // ties, so a token enters only if strictly heavier than the front.
    for (int i = 0; i < k; ++i) top->push_back({w[i], i});
    std::make_heap(top->begin(), top->end(), RanksBefore);
    for (int i = k; i < n; ++i) {
      if (w[i] > top->front().w) {
        std::pop_heap(top->begin(), top->end(), RanksBefore);
        top->back() = {w[i], i};
        std::push_heap(top->begin(), top->end(), RanksBefore);
      }
    }
    return;
  }
  sel_.resize(n);
  for (int i = 0; i < n; ++i) sel_[i] = {w[i], i};
  std::nth_element(sel_.begin(), sel_.begin() + k, sel_.end(), RanksBefore);
  top->assign(sel_.begin(), sel_.begin() + k);
}

void Sampler::TopP(const float* w, int vocab, bool dense, float top_p) {
  if (!dense) {
    double total = 0;
    for (const Candidate& c : kept_) total += c.w;
    sel_ = kept_;
    const Candidate cut = WeightedCut(double{top_p} * total);
    kept_.erase(std::remove_if(kept_.begin(), kept_.end(),
                               [&cut](const Candidate& c) { return RanksBefore(cut, c); }),
                kept_.end());
    return;
  }
  // Radix select over the whole row: the mass per bucket locates the bucket
  // holding the cut in two passes with no data-dependent branches, and only
  // that bucket's tokens are ranked exactly.
  bucket_mass_.assign(kNumBuckets, 0.0);
  for (int i = 0; i < vocab; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &w[i], sizeof bits);
    bucket_mass_[bits >> kBucketShift] += w[i];
  }
  const double target = double{top_p} * SumAtLeast(w, vocab, 0);
  double before = 0;  // mass of the buckets above the cut's
  int bucket = kNumBuckets - 1;
  while (bucket > 0 && before + bucket_mass_[bucket] < target) before += bucket_mass_[bucket--];
  sel_.clear();
  for (int i = 0; i < vocab; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &w[i], sizeof bits);
    if (static_cast<int>(bits >> kBucketShift) == bucket) sel_.push_back({w[i], i});
  }
  // Rounding may leave the target unreached down to bucket 0 (which holds
  // the zero weights too, if any): then everything is kept.
  const Candidate cut = sel_.empty() ? Candidate{0.0f, vocab} : WeightedCut(target - before);
  // Branch-free compaction: about half the tokens may survive, at random.
  kept_.resize(vocab);
  size_t n = 0;
  for (int i = 0; i < vocab; ++i) {
    kept_[n] = {w[i], i};
    n += !RanksBefore(cut, kept_[n]);
  }
  kept_.resize(n);
}

Sampler::Candidate Sampler::WeightedCut(double target) {
  // Bisection by nth_element: [0, lo) are the most likely tokens with mass
  // `before` < target, and the cut lies in [lo, hi). O(size) expected.
  Candidate* const c = sel_.data();
  ptrdiff_t lo = 0, hi = static_cast<ptrdiff_t>(sel_.size());
  double before = 0;
  while (hi - lo > kSortBelow) {
    const ptrdiff_t mid = lo + (hi - lo) / 2;
    std::nth_element(c + lo, c + mid, c + hi, RanksBefore);
    double mass = 0;
    for (ptrdiff_t j = lo; j < mid; ++j) mass += c[j].w;
    if (before + mass >= target) {
      hi = mid;
    } else {
      before += mass;
      lo = mid;
    }
  }
  std::sort(c + lo, c + hi, RanksBefore);
  for (ptrdiff_t j = lo; j < hi; ++j) {
    before += c[j].w;
    if (before >= target) return c[j];
  }
  return c[hi - 1];  // rounding kept the head below target: keep all of it
}

}  // namespace chunkattn
