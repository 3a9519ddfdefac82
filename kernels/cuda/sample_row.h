// The per-row algorithm of the GPU sampler (LaunchSample, layers.h), written
// once over a few collective operations on the row so that the same code runs
// as one CUDA thread block per row (every thread executes it in lockstep, the
// collectives are block-wide) and sequentially on the host (HostRowOps),
// where it is tested against the CPU Sampler on any machine.
//
// Semantics: the CPU Sampler's (workers/sampler/sampler.h), step for step:
// NaN logits and the tokens outside the sample's mask as -inf (the logprob
// too is the masked row's), repetition penalty over the distinct history
// tokens, greedy (ties to the lowest id) or weights exp((logit - max) /
// temperature), top-k then top-p (rank order: heavier first, ties to the
// lower id), min-p, then one inverse-CDF draw in token-id order. The weights
// are bit-equal to the Sampler's (SampleExp is its exp, and no operation is
// contracted), so the cuts are the same tokens; the masses are summed in
// 2^-40 fixed point, which makes them exact and independent of the summation
// order, so the GPU and HostRowOps pick the same token. Against the Sampler,
// whose masses are doubles, only weights below 2^-17 lose bits (under 2^-40
// each), so a draw can differ only where a running mass falls that close to
// the draw or to the top-p target.
//
// Header-only C++17; under nvcc the functions are __host__ __device__.
#ifndef CHUNKATTN_KERNELS_CUDA_SAMPLE_ROW_H_
#define CHUNKATTN_KERNELS_CUDA_SAMPLE_ROW_H_

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#if !defined(__CUDACC__)
#include <vector>
#endif

#include "base/host_device.h"

namespace chunkattn::cuda {

// The largest vocabulary SampleRow takes (its masses are 2^-40 fixed point).
inline constexpr int kMaxSampleVocab = 1 << 23;

// One sample's parameters as the device reads them. The host has validated
// them (ValidateSamplingParams, history tokens in [0, vocab)).
struct SampleRowParams {
  int32_t row = 0;          // logits row to sample from
  float temperature = 0;    // 0 = greedy
  int32_t top_k = 0;        // 0 = off
  float top_p = 1;          // 1 = off
  float min_p = 0;          // 0 = off
  float penalty = 1;        // repetition penalty; 1 = off
  // The sample's history tokens: [history_begin, history_end) of the
  // launch's history array. Read only when penalty != 1; repeats count once.
  int32_t history_begin = 0;
  int32_t history_end = 0;
  // The sample's token mask (SampleInput::allowed): words [mask_begin,
  // mask_begin + mask_words) of the launch's mask array, token t allowed when
  // bit t % 32 of its word t / 32 is set, none past the words. -1: no mask.
  int32_t mask_begin = -1;
  int32_t mask_words = 0;
  double u = 0;  // the draw in [0, 1): UniformForStep(seed, step)
};

struct SampleRowResult {
  // -1 for a row with a +inf logit or no finite logit (the Sampler's
  // INVALID_ARGUMENT); the host reports it.
  int32_t token = -1;
  float logprob = NAN;  // log-softmax of the raw logits at token, nats
};

// The maximum of a row function and its lowest id.
struct RowArgMax {
  float value;
  int id;
};

// A histogram entry of one token: its bin (-1 = not counted) and mass.
struct RowBin {
  int bin;
  uint64_t mass;
};

namespace sample_row_internal {

// IEEE single operations that nvcc must not contract into FMAs nor replace
// under --use_fast_math: the Sampler's weights come from exactly these.
CHUNKATTN_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
CHUNKATTN_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
CHUNKATTN_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
CHUNKATTN_HOST_DEVICE inline uint32_t Bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}
CHUNKATTN_HOST_DEVICE inline float FromBits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// A weight in [0, 1] in 2^-40 units, truncated (exact for w >= 2^-17): the
// sum of a row of up to kMaxSampleVocab of them fits a uint64.
CHUNKATTN_HOST_DEVICE inline uint64_t Fixed(float w) {
  return static_cast<uint64_t>(static_cast<double>(w) * 1099511627776.0);
}

// Whether token i passes a mask of `words` words (null: no mask).
CHUNKATTN_HOST_DEVICE inline bool MaskAllows(const uint32_t* mask, int words, int i) {
  return mask == nullptr || ((i >> 5) < words && ((mask[i >> 5] >> (i & 31)) & 1u) != 0);
}

// Rank order of the cuts: (key, id) comes at or before the cut (cut_key,
// cut_id) when heavier, or as heavy with an id not above. Keys are the bits
// of weights in [0, 1], which order like the weights.
CHUNKATTN_HOST_DEVICE inline bool AtOrBefore(uint32_t key, int id, uint32_t cut_key, int cut_id) {
  return key > cut_key || (key == cut_key && id <= cut_id);
}

}  // namespace sample_row_internal

// exp(x) exactly as the CPU Sampler computes its weights (the scalar form of
// its vectorized exp: Cody-Waite reduction, Cephes' degree-6 polynomial):
// about 2 ulp, exactly 1 at 0, 0 below -87.3 and for NaN.
CHUNKATTN_HOST_DEVICE inline float SampleExp(float x) {
  using namespace sample_row_internal;  // NOLINT: the IEEE helpers above
  if (!(x >= -87.3f)) return 0.0f;
  const float c = x > 88.3f ? 88.3f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = Add(Add(Mul(c, 1.44269504088896341f), magic), -magic);
  float r = Add(c, -Mul(n, 0.693359375f));
  r = Add(r, -Mul(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = Add(Mul(p, r), 1.3981999507e-3f);
  p = Add(Mul(p, r), 8.3334519073e-3f);
  p = Add(Mul(p, r), 4.1665795894e-2f);
  p = Add(Mul(p, r), 1.6666665459e-1f);
  p = Add(Mul(p, r), 5.0000001201e-1f);
  p = Add(Add(Mul(Mul(p, r), r), r), 1.0f);
  const uint32_t scale = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return Mul(p, FromBits(scale));
}

// Samples one row. `Ops` gives the row and the collectives; each collective
// returns the same value to every caller (all threads of a block call it
// together, with the same arguments):
//   int size()                         the vocabulary
//   float Logit(int i)                 the raw logit of token i
//   bool Allowed(int i)                whether the mask lets token i through
//   bool Marked(int i)                 whether i is a history token
//   float Max(f)                       max of f(i) over i (f is never NaN)
//   double SumF64(f), uint64_t SumU64(f)
//   RowArgMax ArgMax(f)                the max of f and its lowest id
//   void Histogram<kMass>(f)           f(i) -> RowBin; then count(b), mass(b)
//                                      for b in [0, 256) (mass if kMass)
//   int NthId(pred, n)                 the id of the n-th (0-based) i with
//                                      pred(i), in id order; -1 if none
//   int DrawId(f, target)              the first i whose running sum of
//                                      f (uint64, id order) exceeds target;
//                                      else the last i with f(i) > 0; -1 if
//                                      no f(i) > 0
template <typename Ops>
CHUNKATTN_HOST_DEVICE SampleRowResult SampleRow(Ops& ops, const SampleRowParams& p) {
  using namespace sample_row_internal;  // NOLINT: the helpers above
  const int n = ops.size();
  // The masked row every later step reads, so a disallowed token is never
  // drawn and counts in no sum (the Sampler's step 1).
  auto sanitized = [&](int i) {
    const float x = ops.Logit(i);
    return x == x && ops.Allowed(i) ? x : -INFINITY;
  };
  const float raw_max = ops.Max(sanitized);
  if (!(raw_max > -INFINITY && raw_max < INFINITY)) return SampleRowResult{};
  const double sum = ops.SumF64([&](int i) { return static_cast<double>(SampleExp(Add(sanitized(i), -raw_max))); });
  auto pick = [&](int token) {
    SampleRowResult r;
    if (token < 0) return r;
    r.token = token;
    r.logprob = static_cast<float>(static_cast<double>(ops.Logit(token)) - raw_max - log(sum));
    return r;
  };

  // HF's RepetitionPenaltyLogitsProcessor: score < 0 ? score * p : score / p.
  const bool penalize = p.penalty != 1.0f;
  auto logit = [&](int i) {
    const float x = sanitized(i);
    if (!penalize || !ops.Marked(i)) return x;
    const float y = x < 0 ? Mul(x, p.penalty) : Div(x, p.penalty);
    // A finite logit stays finite whatever the penalty (as the CPU sampler).
    if (y > FLT_MAX && x <= FLT_MAX) return FLT_MAX;
    if (y < -FLT_MAX && x >= -FLT_MAX) return -FLT_MAX;
    return y;
  };
  if (p.temperature == 0 || p.top_k == 1) {
    const RowArgMax best = ops.ArgMax(logit);
    return best.value > -INFINITY ? pick(best.id) : SampleRowResult{};
  }

  const float max_logit = penalize ? ops.Max(logit) : raw_max;
  if (!(max_logit > -INFINITY && max_logit < INFINITY)) return SampleRowResult{};
  // Unnormalized probabilities, exactly 1 at the max (the shift comes before
  // the division so tiny temperatures do not overflow).
  auto weight = [&](int i) { return SampleExp(Div(Add(logit(i), -max_logit), p.temperature)); };

  // Top-k: the k-th token in rank order, found by a radix select over the
  // weights' bits (8 bits a pass, high first), then among the tokens of
  // that exact weight by id. (0, n) keeps every token.
  uint32_t k_key = 0;
  int k_id = n;
  if (p.top_k > 0 && p.top_k < n) {
    int64_t need = p.top_k;  // rank of the cut among the tokens matching `prefix`
    uint32_t prefix = 0, mask = 0;
    int64_t ties = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      ops.template Histogram<false>([&](int i) {
        const uint32_t key = Bits(weight(i));
        return RowBin{(key & mask) == prefix ? static_cast<int>(key >> shift & 255u) : -1, 0};
      });
      int b = 255;
      while (b > 0 && ops.count(b) < need) need -= ops.count(b--);
      prefix |= static_cast<uint32_t>(b) << shift;
      mask |= 255u << shift;
      ties = ops.count(b);
    }
    k_key = prefix;
    if (need < ties) {
      k_id = ops.NthId([&](int i) { return Bits(weight(i)) == k_key; }, need - 1);
    }
  }
  auto in_top_k = [&](int i, uint32_t key) { return AtOrBefore(key, i, k_key, k_id); };

  // Top-p: the smallest head of the top-k survivors, in rank order, whose
  // mass reaches top_p of theirs; a radix select by mass, then the fewest
  // tokens of the cut's weight (lowest ids first) that reach it.
  uint32_t p_key = 0;
  int p_id = n;
  if (p.top_p < 1.0f) {
    const uint64_t total = ops.SumU64([&](int i) {
      const float w = weight(i);
      return in_top_k(i, Bits(w)) ? Fixed(w) : uint64_t{0};
    });
    // head >= top_p * total  <=>  head >= ceil(top_p * total) for an integer head.
    const uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(p.top_p) * static_cast<double>(total)));
    uint64_t before = 0;  // mass of the tokens ranked above the cut's weight
    uint32_t prefix = 0, mask = 0;
    int64_t ties = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      ops.template Histogram<true>([&](int i) {
        const float w = weight(i);
        const uint32_t key = Bits(w);
        const bool match = in_top_k(i, key) && (key & mask) == prefix;
        return RowBin{match ? static_cast<int>(key >> shift & 255u) : -1, match ? Fixed(w) : 0};
      });
      int b = 255;
      while (b > 0 && before + ops.mass(b) < target) before += ops.mass(b--);
      prefix |= static_cast<uint32_t>(b) << shift;
      mask |= 255u << shift;
      ties = ops.count(b);
    }
    p_key = prefix;
    // The fewest ties that reach the target; all of them when truncation
    // leaves it unreached (the Sampler then keeps the whole head too). The
    // walk only adds masses that stay below the target, so before < target
    // and at least one tie is taken.
    const uint64_t w = Fixed(FromBits(p_key));
    int64_t take = ties;
    if (w > 0) {
      const uint64_t fewest = (target - before + w - 1) / w;
      if (fewest < static_cast<uint64_t>(ties)) take = static_cast<int64_t>(fewest);
    }
    if (take < ties) {
      p_id = ops.NthId([&](int i) {
        const uint32_t key = Bits(weight(i));
        return key == p_key && in_top_k(i, key);
      }, take - 1);
    }
  }

  // Min-p (relative to the most likely token, whose weight is 1), then one
  // draw by inverse CDF over the survivors in token-id order.
  auto kept = [&](int i) -> uint64_t {
    const float w = weight(i);
    const uint32_t key = Bits(w);
    const bool keep = w != 0 && w >= p.min_p && in_top_k(i, key) && AtOrBefore(key, i, p_key, p_id);
    return keep ? Fixed(w) : uint64_t{0};
  };
  const uint64_t total = ops.SumU64(kept);
  // A token is drawn when its running mass exceeds u * total, i.e. its
  // integer running mass exceeds floor(u * total) (below total: u < 1).
  uint64_t target = static_cast<uint64_t>(p.u * static_cast<double>(total));
  if (total > 0 && target >= total) target = total - 1;
  return pick(ops.DrawId(kept, target));
}

// The host side is for host compilers only: under nvcc, SampleRow (host and
// device) over host-only ops would draw cross-side warnings.
#if !defined(__CUDACC__)

// The collectives of SampleRow, sequentially over one row on the host.
class HostRowOps {
 public:
  // marks: (size) nonzero for the history tokens, or null without a penalty.
  // mask: the sample's `mask_words` mask words, or null without a mask.
  HostRowOps(const float* row, int size, const uint8_t* marks, const uint32_t* mask, int mask_words)
      : row_(row), size_(size), marks_(marks), mask_(mask), mask_words_(mask_words) {}

  int size() const { return size_; }
  float Logit(int i) const { return row_[i]; }
  bool Allowed(int i) const { return sample_row_internal::MaskAllows(mask_, mask_words_, i); }
  bool Marked(int i) const { return marks_ != nullptr && marks_[i] != 0; }

  template <typename F>
  float Max(F f) const {
    float m = -INFINITY;
    for (int i = 0; i < size_; ++i) {
      const float x = f(i);
      m = x > m ? x : m;
    }
    return m;
  }
  template <typename F>
  double SumF64(F f) const {
    double s = 0;
    for (int i = 0; i < size_; ++i) s += f(i);
    return s;
  }
  template <typename F>
  uint64_t SumU64(F f) const {
    uint64_t s = 0;
    for (int i = 0; i < size_; ++i) s += f(i);
    return s;
  }
  template <typename F>
  RowArgMax ArgMax(F f) const {
    RowArgMax best{-INFINITY, 0};
    for (int i = 0; i < size_; ++i) {
      const float x = f(i);
      if (x > best.value) best = {x, i};
    }
    return best;
  }
  template <bool kMass, typename F>
  void Histogram(F f) {
    for (int b = 0; b < 256; ++b) count_[b] = mass_[b] = 0;
    for (int i = 0; i < size_; ++i) {
      const RowBin x = f(i);
      if (x.bin < 0) continue;
      ++count_[x.bin];
      if (kMass) mass_[x.bin] += x.mass;
    }
  }
  int64_t count(int b) const { return count_[b]; }
  uint64_t mass(int b) const { return mass_[b]; }
  template <typename P>
  int NthId(P pred, int64_t nth) const {
    for (int i = 0; i < size_; ++i) {
      if (pred(i) && nth-- == 0) return i;
    }
    return -1;
  }
  template <typename F>
  int DrawId(F f, uint64_t target) const {
    uint64_t cum = 0;
    int last = -1;
    for (int i = 0; i < size_; ++i) {
      const uint64_t w = f(i);
      if (w == 0) continue;
      last = i;
      cum += w;
      if (cum > target) return i;
    }
    return last;
  }

 private:
  const float* row_;
  int size_;
  const uint8_t* marks_;
  const uint32_t* mask_;
  int mask_words_;
  int64_t count_[256] = {};
  uint64_t mass_[256] = {};
};

// SampleRow over `row` (vocab fp32 logits) on the host. `history` and
// `masks` hold the whole launch's history and mask arrays that
// p.history_begin/end and p.mask_begin/words index (either may be null when
// no sample reads it).
inline SampleRowResult SampleRowOnHost(const float* row, int vocab, const SampleRowParams& p,
                                       const int32_t* history, const uint32_t* masks) {
  std::vector<uint8_t> marks;
  if (p.penalty != 1.0f) {
    marks.assign(vocab, 0);
    for (int32_t k = p.history_begin; k < p.history_end; ++k) marks[history[k]] = 1;
  }
  const uint32_t* mask = p.mask_begin >= 0 ? masks + p.mask_begin : nullptr;
  HostRowOps ops(row, vocab, marks.empty() ? nullptr : marks.data(), mask, p.mask_words);
  return SampleRow(ops, p);
}

#endif  // !defined(__CUDACC__)

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_SAMPLE_ROW_H_
