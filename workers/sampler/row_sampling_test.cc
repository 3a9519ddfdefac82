// The GPU sampler's row algorithm (kernels/cuda/sample_row.h), run on the
// host, against the CPU Sampler: the same token for every seeded draw over
// random rows, parameters, ties and bad rows, and the same weights bit for
// bit. The GPU runs this very code, so this is where its logic is tested on
// machines without one (kernels/cuda/tests/sampling_test.cc then holds the
// device to this host version).
#include "workers/sampler/row_sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "workers/sampler/token_mask_testing.h"

namespace chunkattn::row_sampling_test {  // its own: unity builds join this file with sampler_test.cc
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t BitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TEST(RowSampling, ExpIsTheSamplersBitForBit) {
  std::vector<float> xs = {0.0f, -0.0f, -87.3f, std::nextafter(-87.3f, -kInf), std::nextafter(-87.3f, 0.0f),
                           88.3f, 100.0f, -1e-30f, -1e-40f, 1e-40f, -kInf, kInf, kNaN};
  // Every 97th float of [-90, 0] plus a stretch above 0 (weights take x <= 0).
  for (uint32_t b = BitsOf(-0.0f); b <= BitsOf(-90.0f); b += 97) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    xs.push_back(x);
  }
  for (float x = 0; x < 90; x += 0.013f) xs.push_back(x);
  for (const float x : xs) {
    const float want = SamplerExp(x), got = cuda::SampleExp(x);
    ASSERT_EQ(BitsOf(got), BitsOf(want)) << "x = " << x << ": " << got << " vs " << want;
  }
}

struct Case {
  std::vector<float> logits;  // (rows, vocab)
  int vocab = 0;
  std::vector<int32_t> rows;
  std::vector<SamplingParams> params;
  std::vector<std::vector<int32_t>> history;
  std::vector<std::vector<uint32_t>> allowed;  // token masks; missing ones are empty
  std::vector<SampleInput> inputs;

  void Finish() {
    inputs.resize(params.size());
    allowed.resize(params.size());
    for (size_t s = 0; s < params.size(); ++s) {
      inputs[s].params = &params[s];
      inputs[s].history = history[s];
      inputs[s].step = 1000 + s;
      inputs[s].allowed = allowed[s];
    }
  }
};

// Runs both samplers over every sample; the Sampler sees each sample's row
// alone. Returns the number of samples compared.
int ExpectSameAsSampler(const Case& c, const std::string& what) {
  PackedSamples packed;
  const int64_t num_rows = static_cast<int64_t>(c.logits.size()) / c.vocab;
  const absl::Status packed_ok = PackSamples(c.rows, c.inputs, c.vocab, num_rows, &packed);
  EXPECT_TRUE(packed_ok.ok()) << what << ": " << packed_ok;
  if (!packed_ok.ok()) return 0;
  std::vector<SampleResult> got(c.inputs.size());
  SampleRowsOnHost(c.logits, c.vocab, packed, absl::MakeSpan(got));
  Sampler sampler;
  for (size_t s = 0; s < c.inputs.size(); ++s) {
    const float* row = c.logits.data() + static_cast<size_t>(c.rows[s]) * c.vocab;
    SampleResult want;
    const absl::Status st = sampler.Sample(absl::MakeConstSpan(row, c.vocab), c.vocab, {&c.inputs[s], 1},
                                           absl::MakeSpan(&want, 1));
    const SamplingParams& p = c.params[s];
    const std::string name = absl::StrFormat(
        "%s, sample %d (row %d, vocab %d): T %g top_k %d top_p %g min_p %g penalty %g history %d mask %d words",
        what, s, c.rows[s], c.vocab, p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty,
        c.history[s].size(), c.allowed[s].size());
    if (!st.ok()) {
      EXPECT_EQ(got[s].token, -1) << name << ": the Sampler says " << st;
      continue;
    }
    EXPECT_EQ(got[s].token, want.token) << name;
    EXPECT_TRUE(sampler_testing::MaskAllows(c.allowed[s], got[s].token)) << name;
    EXPECT_NEAR(got[s].logprob, want.logprob, 1e-5 * (1 + std::abs(want.logprob))) << name;
    // The top entries come from the Sampler's own code (AddTopLogprobs), and
    // the token's logprob from its entry.
    EXPECT_EQ(got[s].top.size, want.top.size) << name << " top_logprobs " << p.top_logprobs;
    for (int j = 0; j < std::min(got[s].top.size, want.top.size); ++j) {
      EXPECT_EQ(got[s].top.ids[j], want.top.ids[j]) << name << " entry " << j;
      EXPECT_EQ(got[s].top.logprobs[j], want.top.logprobs[j]) << name << " entry " << j;
      if (want.top.ids[j] == want.token) {
        EXPECT_EQ(got[s].logprob, want.logprob) << name;
      }
    }
  }
  return static_cast<int>(c.inputs.size());
}

SamplingParams RandomParams(std::mt19937& rng, int vocab) {
  auto pick = [&rng](auto const& options) { return options[rng() % options.size()]; };
  SamplingParams p;
  p.temperature = pick(std::vector<float>{0.0f, 0.05f, 0.3f, 0.7f, 1.0f, 1.0f, 1.5f});
  p.top_k = pick(std::vector<int>{0, 0, 1, 2, 5, 40, vocab - 1, vocab, vocab + 3});
  p.top_p = pick(std::vector<float>{1.0f, 1.0f, 0.95f, 0.9f, 0.5f, 0.1f, 1e-6f});
  p.min_p = pick(std::vector<float>{0.0f, 0.0f, 0.01f, 0.1f, 0.5f});
  p.repetition_penalty = pick(std::vector<float>{1.0f, 1.0f, 1.3f, 0.7f});
  p.seed = rng();
  p.top_logprobs = std::vector<int>{0, 0, 1, 5, kMaxTopLogprobs}[p.seed % 5];  // no extra draw: keeps the stream
  return p;
}

TEST(RowSampling, MatchesTheSamplerOnRandomRows) {
  std::mt19937 rng(20261121);
  int compared = 0;
  for (int trial = 0; trial < 150; ++trial) {
    Case c;
    c.vocab = std::vector<int>{1, 2, 3, 7, 97, 1000, 4099, 32003}[trial % 8];
    const int num_rows = 1 + static_cast<int>(rng() % 4);
    const float scale = std::vector<float>{0.1f, 1.0f, 3.0f, 30.0f}[rng() % 4];
    std::normal_distribution<float> normal(0.0f, scale);
    c.logits.resize(static_cast<size_t>(num_rows) * c.vocab);
    for (float& x : c.logits) x = normal(rng);
    // Some NaN and -inf logits, and some copies (ties) of other logits.
    for (int k = 0; k < c.vocab / 20; ++k) {
      c.logits[rng() % c.logits.size()] = kNaN;
      c.logits[rng() % c.logits.size()] = -kInf;
      c.logits[rng() % c.logits.size()] = c.logits[rng() % c.logits.size()];
    }
    const int samples = 1 + static_cast<int>(rng() % 6);
    for (int s = 0; s < samples; ++s) {
      c.rows.push_back(static_cast<int32_t>(rng() % num_rows));  // rows may repeat (n > 1)
      c.params.push_back(RandomParams(rng, c.vocab));
      std::vector<int32_t> h(rng() % 40);
      for (int32_t& t : h) t = static_cast<int32_t>(rng() % c.vocab);
      c.history.push_back(h);
    }
    c.Finish();
    compared += ExpectSameAsSampler(c, absl::StrFormat("trial %d", trial));
  }
  EXPECT_GT(compared, 300);
}

// Rows of few distinct values: the top-k and top-p cuts fall among ties,
// which the rank order settles by id.
TEST(RowSampling, MatchesTheSamplerAmongTies) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Case c;
    c.vocab = std::vector<int>{4, 10, 64, 513}[trial % 4];
    c.logits.resize(c.vocab);
    const std::vector<float> levels = {0.0f, 0.5f, 1.0f, -2.0f, 3.0f};
    const int distinct = 1 + trial % 5;
    for (float& x : c.logits) x = levels[rng() % distinct];
    for (int s = 0; s < 4; ++s) {
      c.rows.push_back(0);
      SamplingParams p = RandomParams(rng, c.vocab);
      p.temperature = std::vector<float>{0.0f, 1.0f, 0.5f}[s % 3];
      p.top_k = std::vector<int>{0, 1, 3, c.vocab / 2}[rng() % 4];
      p.top_p = std::vector<float>{1.0f, 0.5f, 0.25f, 0.1f, 0.9f}[rng() % 5];
      c.params.push_back(p);
      std::vector<int32_t> h;
      if (rng() % 2) h = {0, 1, 1, static_cast<int32_t>(c.vocab - 1)};
      c.history.push_back(h);
    }
    c.Finish();
    ExpectSameAsSampler(c, absl::StrFormat("ties trial %d", trial));
  }
}

// A logit whose weight at temperature 1 is exactly 1/2, so masses can hit
// the cut targets exactly.
float LogitOfWeightHalf() {
  float x = -0.6931472f;
  for (int k = 0; k < 1000 && cuda::SampleExp(x) != 0.5f; ++k) {
    x = std::nextafter(x, cuda::SampleExp(x) < 0.5f ? 0.0f : -1.0f);
  }
  return x;
}

// Cuts and draws that land exactly on a boundary: top-p stops at the first
// head that reaches top_p (>=), min-p keeps a weight equal to it, and a draw
// equal to a running mass goes to the next token (the Sampler's strict <).
TEST(RowSampling, ExactBoundariesAsTheSampler) {
  const float half = LogitOfWeightHalf();
  ASSERT_EQ(cuda::SampleExp(half), 0.5f);
  // One row sampled with `p` under 64 seeds.
  auto seeded = [](std::vector<float> logits, SamplingParams p) {
    Case c;
    c.vocab = static_cast<int>(logits.size());
    c.logits = std::move(logits);
    for (int s = 0; s < 64; ++s) {
      p.seed = s;
      c.rows.push_back(0);
      c.params.push_back(p);
      c.history.push_back({});
    }
    c.Finish();
    return c;
  };
  SamplingParams top_p;
  top_p.top_p = 0.5f;
  // Weights 1, 1, 1/2 x 4: top_p 1/2 of 4 is reached by the first two.
  EXPECT_EQ(ExpectSameAsSampler(seeded({0, 0, half, half, half, half}, top_p), "top-p on a boundary"), 64);
  {
    // Weights 1 and 1/2 with min_p 1/2: both stay, token 1 drawn a third of the time.
    SamplingParams min_p;
    min_p.min_p = 0.5f;
    const Case c = seeded({0, half}, min_p);
    EXPECT_EQ(ExpectSameAsSampler(c, "min-p on a boundary"), 64);
    PackedSamples packed;
    ASSERT_TRUE(PackSamples(c.rows, c.inputs, c.vocab, 1, &packed).ok());
    std::vector<SampleResult> got(64);
    SampleRowsOnHost(c.logits, c.vocab, packed, absl::MakeSpan(got));
    int ones = 0;
    for (const SampleResult& r : got) ones += r.token == 1;
    EXPECT_GT(ones, 5);
  }
  // Two equal weights: a draw of exactly 1/2 is past the first token's mass.
  const std::vector<float> row = {0, 0};
  cuda::SampleRowParams p;
  p.temperature = 1;
  p.u = 0.5;
  EXPECT_EQ(cuda::SampleRowOnHost(row.data(), 2, p, nullptr, nullptr).token, 1);
  p.u = std::nextafter(0.5, 0.0);
  EXPECT_EQ(cuda::SampleRowOnHost(row.data(), 2, p, nullptr, nullptr).token, 0);
  p.u = 0;
  EXPECT_EQ(cuda::SampleRowOnHost(row.data(), 2, p, nullptr, nullptr).token, 0);
}

// Rows the Sampler refuses give token -1, greedy or not; a penalty that
// overflows a finite logit clamps it instead (one request's parameters never
// fail a row).
TEST(RowSampling, BadRowsGiveNoToken) {
  Case c;
  c.vocab = 5;
  c.logits = {0, 1, kInf, 2, 3,                    // a +inf logit
              kNaN, kNaN, kNaN, kNaN, kNaN,       // nothing finite
              -kInf, -kInf, kNaN, -kInf, -kInf,   // nothing finite
              1e38f, 3e38f, 2e38f, 0, 1};         // the penalty overflows a logit: clamped
  for (int row = 0; row < 4; ++row) {
    for (const float temperature : {0.0f, 1.0f}) {
      SamplingParams p;
      p.temperature = temperature;
      p.repetition_penalty = row == 3 ? 0.1f : 1.0f;
      c.rows.push_back(row);
      c.params.push_back(p);
      c.history.push_back({1});
    }
  }
  c.Finish();
  PackedSamples packed;
  ASSERT_TRUE(PackSamples(c.rows, c.inputs, c.vocab, 4, &packed).ok());
  std::vector<SampleResult> got(c.inputs.size());
  SampleRowsOnHost(c.logits, c.vocab, packed, absl::MakeSpan(got));
  for (size_t s = 0; s < got.size(); ++s) {
    if (c.rows[s] == 3) {
      EXPECT_EQ(got[s].token, 1) << "the clamped logit dominates, greedy or not";
    } else {
      EXPECT_EQ(got[s].token, -1) << "sample " << s;
    }
  }
  EXPECT_EQ(ExpectSameAsSampler(c, "bad rows"), 8);
}

// Token masks: the row algorithm with a sample's mask (SampleRowOnHost over
// the packed masks) draws what the Sampler draws with the same `allowed`,
// over random rows, every path, dense, sparse and short masks, vocabularies
// off a multiple of 32, and logits the mask hides (+inf among them) or
// leaves with nothing finite.
TEST(RowSampling, MasksMatchTheSampler) {
  std::mt19937 rng(20260301);
  int compared = 0;
  for (int trial = 0; trial < 150; ++trial) {
    Case c;
    c.vocab = std::vector<int>{1, 2, 31, 33, 97, 1000, 4099, 32003}[trial % 8];
    const int num_rows = 1 + static_cast<int>(rng() % 3);
    std::normal_distribution<float> normal(0.0f, std::vector<float>{0.3f, 1.0f, 5.0f}[rng() % 3]);
    c.logits.resize(static_cast<size_t>(num_rows) * c.vocab);
    for (float& x : c.logits) x = normal(rng);
    for (int k = 0; k < 1 + c.vocab / 16; ++k) {
      c.logits[rng() % c.logits.size()] = kNaN;
      c.logits[rng() % c.logits.size()] = -kInf;
      c.logits[rng() % c.logits.size()] = c.logits[rng() % c.logits.size()];
    }
    const int samples = 1 + static_cast<int>(rng() % 6);
    for (int s = 0; s < samples; ++s) {
      const int32_t row = static_cast<int32_t>(rng() % num_rows);
      c.rows.push_back(row);
      c.params.push_back(RandomParams(rng, c.vocab));
      std::vector<int32_t> h(rng() % 20);
      for (int32_t& t : h) t = static_cast<int32_t>(rng() % c.vocab);
      c.history.push_back(h);
      // Most samples constrained; samples sharing a row see their own masks.
      c.allowed.push_back(rng() % 5 == 0 ? std::vector<uint32_t>{} : sampler_testing::RandomTokenMask(c.vocab, rng));
      // A +inf that the mask hides fails nothing (another sample of the row
      // may see it: both samplers refuse that one).
      const int t = static_cast<int>(rng() % c.vocab);
      if (rng() % 3 == 0 && !sampler_testing::MaskAllows(c.allowed.back(), t)) {
        c.logits[static_cast<size_t>(row) * c.vocab + t] = kInf;
      }
    }
    c.Finish();
    compared += ExpectSameAsSampler(c, absl::StrFormat("masked trial %d", trial));
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(compared, 300);
}

TEST(RowSampling, PackChecksTheInputsAsTheSamplerDoes) {
  const int vocab = 10;
  SamplingParams good;
  good.temperature = 0.5f;
  SamplingParams penalized = good;
  penalized.repetition_penalty = 1.2f;
  SamplingParams bad = good;
  bad.top_p = 0;
  const std::vector<int32_t> history = {3, 3, 9};
  const std::vector<int32_t> out_of_range = {10};
  PackedSamples packed;

  std::vector<SampleInput> in(2);
  in[0].params = &good;
  in[1].params = &penalized;
  in[1].history = history;
  in[1].step = 5;
  ASSERT_TRUE(PackSamples({0, 1}, in, vocab, 2, &packed).ok());
  EXPECT_TRUE(packed.penalized);
  ASSERT_EQ(packed.params.size(), 2u);
  EXPECT_EQ(packed.params[0].history_begin, packed.params[0].history_end);  // no penalty, no history
  EXPECT_EQ(packed.params[1].history_end - packed.params[1].history_begin, 3);
  EXPECT_EQ(packed.params[1].row, 1);
  EXPECT_EQ(packed.params[1].u, UniformForStep(penalized.seed, 5));

  EXPECT_FALSE(PackSamples({0}, in, vocab, 2, &packed).ok()) << "one row for two samples";
  EXPECT_FALSE(PackSamples({0, 2}, in, vocab, 2, &packed).ok()) << "row out of range";
  EXPECT_FALSE(PackSamples({0, -1}, in, vocab, 2, &packed).ok()) << "negative row";
  EXPECT_FALSE(PackSamples({0, 1}, in, 0, 2, &packed).ok()) << "no vocabulary";
  in[1].history = out_of_range;
  EXPECT_FALSE(PackSamples({0, 1}, in, vocab, 2, &packed).ok()) << "history token out of range";
  in[0].history = out_of_range;  // read only with a penalty
  in[1].history = history;
  EXPECT_TRUE(PackSamples({0, 1}, in, vocab, 2, &packed).ok());
  in[1].params = &bad;
  EXPECT_FALSE(PackSamples({0, 1}, in, vocab, 2, &packed).ok()) << "top_p 0";
  in[1].params = nullptr;
  EXPECT_FALSE(PackSamples({0, 1}, in, vocab, 2, &packed).ok()) << "null params";
  in.resize(1);
  ASSERT_TRUE(PackSamples({0}, in, vocab, 1, &packed).ok());
  EXPECT_FALSE(packed.penalized);
  EXPECT_TRUE(packed.masks.empty());
  EXPECT_EQ(packed.params[0].mask_begin, -1);
}

// Masks are concatenated in sample order, each named by its first word and
// length; an unconstrained sample has none, and a mask longer than the
// vocabulary's words is refused as the Sampler refuses it.
TEST(RowSampling, PackConcatenatesTheMasks) {
  const int vocab = 40;  // two words
  SamplingParams p;
  const std::vector<uint32_t> a = {5, 1}, b = {~uint32_t{0}}, too_long = {1, 1, 1};
  std::vector<SampleInput> in(3);
  for (SampleInput& x : in) x.params = &p;
  in[0].allowed = a;
  in[2].allowed = b;
  PackedSamples packed;
  ASSERT_TRUE(PackSamples({0, 0, 1}, in, vocab, 2, &packed).ok());
  EXPECT_EQ(packed.masks, (std::vector<uint32_t>{5, 1, ~uint32_t{0}}));
  EXPECT_EQ(packed.params[0].mask_begin, 0);
  EXPECT_EQ(packed.params[0].mask_words, 2);
  EXPECT_EQ(packed.params[1].mask_begin, -1);
  EXPECT_EQ(packed.params[2].mask_begin, 2);
  EXPECT_EQ(packed.params[2].mask_words, 1);
  in[1].allowed = too_long;
  const absl::Status st = PackSamples({0, 0, 1}, in, vocab, 2, &packed);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sample 1"), std::string::npos) << st;
  // Packing again starts afresh.
  in[1].allowed = {};
  in.resize(2);
  ASSERT_TRUE(PackSamples({0, 0}, in, vocab, 2, &packed).ok());
  EXPECT_EQ(packed.masks, a);
}

}  // namespace
}  // namespace chunkattn::row_sampling_test
