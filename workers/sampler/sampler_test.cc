#include "workers/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "workers/sampler/token_mask_testing.h"

namespace chunkattn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// log_softmax(row)[token] in float64, NaN counting as -inf.
double RefLogProb(const std::vector<float>& row, int token) {
  double m = -std::numeric_limits<double>::infinity();
  for (float x : row) {
    if (!std::isnan(x)) m = std::max(m, double{x});
  }
  double sum = 0;
  for (float x : row) {
    if (!std::isnan(x)) sum += std::exp(double{x} - m);
  }
  return double{row[token]} - m - std::log(sum);
}

// The filtered, renormalized distribution Sample() draws from, in float64,
// written straight from the HF warpers. `slack` > 0 widens the top-p and
// min-p cuts so that a token on the edge (where float and double rounding may
// disagree) counts as allowed.
std::vector<double> RefDistribution(const std::vector<float>& row, const SamplingParams& p,
                                    const std::vector<int32_t>& history, double slack = 0) {
  const int vocab = static_cast<int>(row.size());
  std::vector<double> y(vocab);
  for (int i = 0; i < vocab; ++i) y[i] = std::isnan(row[i]) ? -INFINITY : row[i];
  for (int32_t t : std::set<int32_t>(history.begin(), history.end())) {
    y[t] = y[t] < 0 ? y[t] * p.repetition_penalty : y[t] / p.repetition_penalty;
  }
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return y[a] > y[b]; });
  std::vector<double> prob(vocab, 0.0);
  if (p.temperature == 0 || p.top_k == 1) {
    prob[order[0]] = 1;
    return prob;
  }
  int kept = vocab;
  if (p.top_k > 0) kept = std::min(kept, p.top_k);
  double total = 0;
  for (int j = 0; j < kept; ++j) total += std::exp((y[order[j]] - y[order[0]]) / p.temperature);
  double cum = 0;
  int nucleus = 0;
  for (int j = 0; j < kept; ++j) {
    if (p.top_p < 1 && cum >= p.top_p * (1 + slack)) break;
    cum += std::exp((y[order[j]] - y[order[0]]) / p.temperature) / total;
    ++nucleus;
  }
  double sum = 0;
  for (int j = 0; j < nucleus; ++j) {
    const double w = std::exp((y[order[j]] - y[order[0]]) / p.temperature);  // max is 1
    if (w < p.min_p * (1 - slack)) continue;
    prob[order[j]] = w;
    sum += w;
  }
  for (double& q : prob) q /= sum;
  return prob;
}

std::vector<float> RandomLogits(int vocab, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0, scale);
  std::vector<float> row(vocab);
  for (float& x : row) x = normal(rng);
  return row;
}

// Samples one sequence alone.
SampleResult SampleSingle(Sampler& sampler, const std::vector<float>& row,
                          const SamplingParams& params, uint64_t step,
                          const std::vector<int32_t>& history = {}) {
  SampleInput input{&params, history, step, {}};
  SampleResult result;
  const absl::Status status = sampler.Sample(row, static_cast<int>(row.size()), {&input, 1}, {&result, 1});
  EXPECT_TRUE(status.ok()) << status;
  return result;
}

SampleInput In(const SamplingParams* params, absl::Span<const int32_t> history = {},
               uint64_t step = 0) {
  return SampleInput{params, history, step, {}};
}

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(ValidateSamplingParamsTest, AcceptsDefaultsAndEdges) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  SamplingParams p;
  p.temperature = 0;
  p.top_k = 1;
  p.top_p = 1e-6f;
  p.min_p = 1;
  p.repetition_penalty = 0.01f;
  p.top_logprobs = kMaxTopLogprobs;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

TEST(ValidateSamplingParamsTest, RejectsEachBadFieldByName) {
  struct Case {
    const char* field;
    void (*set)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -1; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kNaN; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kInf; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -1; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = kNaN; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.1f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = kNaN; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = -2; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = kNaN; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = kInf; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = -1; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = kMaxTopLogprobs + 1; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p);
    const absl::Status status = ValidateSamplingParams(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string::npos) << status;

    // Sample() checks too, naming the sequence.
    Sampler sampler;
    const std::vector<float> logits = {0, 1, 0, 1};
    const SamplingParams greedy = Greedy();
    SampleInput inputs[2] = {In(&greedy), In(&p)};
    SampleResult out[2];
    const absl::Status batch = sampler.Sample(logits, 2, inputs, out);
    EXPECT_EQ(batch.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(batch.message().find("sequence 1"), std::string::npos) << batch;
    EXPECT_NE(batch.message().find(c.field), std::string::npos) << batch;
  }
}

TEST(SamplerTest, GreedyPicksArgmaxWithRawLogprob) {
  std::mt19937 rng(1);
  const int vocab = 3001, num_seqs = 8;  // several 1024-logit blocks and a ragged tail
  std::vector<float> logits;
  for (int s = 0; s < num_seqs; ++s) {
    const std::vector<float> row = RandomLogits(vocab, 3, rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  const SamplingParams greedy = Greedy();
  std::vector<SampleInput> inputs(num_seqs, In(&greedy));
  std::vector<SampleResult> out(num_seqs);
  Sampler sampler;
  ASSERT_TRUE(sampler.Sample(logits, vocab, inputs, absl::MakeSpan(out)).ok());
  for (int s = 0; s < num_seqs; ++s) {
    const std::vector<float> row(logits.begin() + s * vocab, logits.begin() + (s + 1) * vocab);
    const int want = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
    EXPECT_EQ(out[s].token, want) << "sequence " << s;
    EXPECT_NEAR(out[s].logprob, RefLogProb(row, want), 1e-5) << "sequence " << s;
  }
}

TEST(SamplerTest, GreedyTiesGoToLowestId) {
  Sampler sampler;
  EXPECT_EQ(SampleSingle(sampler, {1, 5, 2, 5, 5}, Greedy(), 0).token, 1);
  EXPECT_EQ(SampleSingle(sampler, {-kInf, 0, 0}, Greedy(), 0).token, 1);
  EXPECT_NEAR(SampleSingle(sampler, {3, 3, 3, 3}, Greedy(), 0).logprob, std::log(0.25), 1e-6);
  // Across blocks and in the tail.
  std::vector<float> row(3001, 0.0f);
  row[2500] = 7;
  row[1500] = 7;
  EXPECT_EQ(SampleSingle(sampler, row, Greedy(), 0).token, 1500);
  row[3000] = 8;
  EXPECT_EQ(SampleSingle(sampler, row, Greedy(), 0).token, 3000);
  SamplingParams penalized = Greedy();
  penalized.repetition_penalty = 2;
  EXPECT_EQ(SampleSingle(sampler, row, penalized, 0, {3000, 1500}).token, 2500);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  std::mt19937 rng(2);
  Sampler sampler;
  SamplingParams p;
  p.temperature = 5;  // flat: a real draw would stray from the argmax
  p.top_k = 1;
  for (uint64_t step = 0; step < 50; ++step) {
    p.seed = step * 7;
    const std::vector<float> row = RandomLogits(300, 1, rng);
    EXPECT_EQ(SampleSingle(sampler, row, p, step).token,
              SampleSingle(sampler, row, Greedy(), step).token);
  }
}

TEST(SamplerTest, SampledLogprobIsRawLogSoftmax) {
  std::mt19937 rng(3);
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0.6f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.3f;
  const std::vector<int32_t> history = {5, 9, 5, 100};
  for (uint64_t step = 0; step < 20; ++step) {
    const std::vector<float> row = RandomLogits(32000, 4, rng);
    const SampleResult r = SampleSingle(sampler, row, p, step, history);
    EXPECT_NEAR(r.logprob, RefLogProb(row, r.token), 1e-4) << "step " << step;
  }
}

// Property: whatever the logits and filters, the token drawn is one the
// reference filters keep.
TEST(SamplerTest, FiltersNeverReturnFilteredTokens) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> unit(0, 1);
  Sampler sampler;
  int drawn = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int vocab = trial % 3 == 0 ? 50 : trial % 3 == 1 ? 500 : 5000;
    // Scale 0.3 is flat enough for the nucleus to pass the first 256-token sort.
    std::vector<float> row = RandomLogits(vocab, trial % 2 ? 3.0f : 0.3f, rng);
    if (trial % 5 == 0) row[trial % vocab] = kNaN;
    if (trial % 7 == 0) row[(trial * 3) % vocab] = -kInf;
    SamplingParams p;
    p.temperature = 0.2f + 2 * unit(rng);
    // Each filter on or off independently: every combination occurs.
    p.top_k = rng() % 2 ? 0 : 1 + static_cast<int>(rng() % (vocab / 2));
    p.top_p = rng() % 2 ? 1.0f : 0.05f + 0.95f * unit(rng);
    p.min_p = rng() % 3 ? 0.3f * unit(rng) : 0.0f;
    p.repetition_penalty = trial % 3 == 0 ? 1.0f : 0.5f + unit(rng);
    p.seed = rng();
    std::vector<int32_t> history;
    for (int i = 0; i < 20; ++i) history.push_back(static_cast<int32_t>(rng() % vocab));
    const std::vector<double> allowed = RefDistribution(row, p, history, /*slack=*/1e-4);
    for (uint64_t step = 0; step < 20; ++step) {
      const SampleResult r = SampleSingle(sampler, row, p, step, history);
      ASSERT_GE(r.token, 0);
      ASSERT_LT(r.token, vocab);
      ASSERT_GT(allowed[r.token], 0) << "trial " << trial << " step " << step << " token "
                                     << r.token << " top_k " << p.top_k << " top_p " << p.top_p
                                     << " min_p " << p.min_p;
      ++drawn;
    }
  }
  EXPECT_EQ(drawn, 300 * 20);
}

TEST(SamplerTest, TopKTiesAtTheCutKeepLowerIds) {
  Sampler sampler;
  SamplingParams p;
  p.top_k = 3;
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 200; ++step) {
    seen.insert(SampleSingle(sampler, std::vector<float>(10, 0.5f), p, step).token);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, TopPKeepsSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (token order shuffled).
  const std::vector<float> row = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  Sampler sampler;
  SamplingParams p;
  for (const auto& [top_p, want] : std::vector<std::pair<float, std::set<int32_t>>>{
           {0.4f, {1}}, {0.75f, {1, 3}}, {0.85f, {0, 1, 3}}, {0.99f, {0, 1, 2, 3}}}) {
    p.top_p = top_p;
    std::set<int32_t> seen;
    for (uint64_t step = 0; step < 400; ++step) seen.insert(SampleSingle(sampler, row, p, step).token);
    EXPECT_EQ(seen, want) << "top_p " << top_p;
  }
}

TEST(SamplerTest, TopPOnAFlatVocabularyCutsByTokenId) {
  // 20000 equal weights, top_p 0.5: the nucleus is exactly ids [0, 10000),
  // found by selection (it is far wider than any sorted head) with ties to
  // the lower id. Token 5 is pushed down by a little so it is cut too.
  std::vector<float> row(20000, 1.0f);
  row[5] = 0.5f;
  Sampler sampler;
  SamplingParams p;
  p.top_p = 0.5f;
  p.seed = 3;
  int32_t lo = row.size(), hi = -1;
  for (uint64_t step = 0; step < 300; ++step) {
    const int32_t t = SampleSingle(sampler, row, p, step).token;
    ASSERT_NE(t, 5);
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  EXPECT_LT(lo, 1000);
  EXPECT_GT(hi, 9000);
  const std::vector<double> want = RefDistribution(row, p, {});
  EXPECT_GT(want[hi], 0);  // ids up to 10000 stay: 9999 others plus token 5's share
  EXPECT_LE(hi, 10000);
}

TEST(SamplerTest, TopPStopsWhereTheMassReachesPExactly) {
  // Four equal weights, top_p 0.5: two tokens reach exactly half, as HF
  // keeps (it drops tokens whose ascending cumulative mass is <= 1 - top_p).
  Sampler sampler;
  SamplingParams p;
  p.top_p = 0.5f;
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 200; ++step) seen.insert(SampleSingle(sampler, {2, 2, 2, 2}, p, step).token);
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

// Chi-square goodness of fit of `draws` draws (steps 0..draws-1) against the
// reference distribution; also no draw outside its support.
void ExpectMatchesDistribution(const std::vector<float>& row, const SamplingParams& p,
                               const std::vector<int32_t>& history, int draws) {
  const std::vector<double> want = RefDistribution(row, p, history);
  std::vector<int> count(row.size(), 0);
  Sampler sampler;
  for (int step = 0; step < draws; ++step) ++count[SampleSingle(sampler, row, p, step, history).token];
  double chi2 = 0;
  int support = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    if (want[i] == 0) {
      EXPECT_EQ(count[i], 0) << "token " << i << " is filtered out";
      continue;
    }
    ++support;
    const double expected = want[i] * draws;
    chi2 += (count[i] - expected) * (count[i] - expected) / expected;
  }
  ASSERT_GE(support, 3) << "the case should keep several tokens";
  // 99.9999th percentile of chi-square with <= 9 degrees of freedom is < 45:
  // a correct sampler fails this about once in a million seeds, a wrong
  // distribution (a missed penalty, a filter off by one token) far exceeds it.
  EXPECT_LT(chi2, 45) << "support " << support;
}

TEST(SamplerTest, FrequenciesMatchTemperatureOnly) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 11;
  ExpectMatchesDistribution({1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -kInf, 1.5f, -1.0f}, p, {}, 20000);
}

TEST(SamplerTest, FrequenciesMatchMinPOnly) {
  SamplingParams p;
  p.temperature = 1.1f;
  p.min_p = 0.25f;  // keeps 3, 6, 0, 8 (w .31); drops 1 (w .20) and below
  p.seed = 14;
  ExpectMatchesDistribution({1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f, 1.6f, -1.0f, 0.7f, -0.8f}, p, {},
                            20000);
}

TEST(SamplerTest, FrequenciesMatchAllFilters) {
  // Sorted by logit: 3 (2.0), 6 (1.6), 0 (1.0), 8 (0.7), 1 (0.2), 4 (0.0), 2, 9, 7, 5.
  const std::vector<float> row = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f, 1.6f, -1.0f, 0.7f, -0.8f};
  SamplingParams p;
  p.temperature = 1.3f;
  p.top_k = 8;      // drops 7 and 5: probabilities of the rest .30 .22 .14 .11 .08 .07 .04 .04
  p.top_p = 0.9f;   // drops 2 and 9 (the first six reach .92)
  p.min_p = 0.23f;  // drops 4 (.065 / .304 = .21 of the top); 1 (.25 of the top) stays
  p.seed = 12;
  const std::vector<double> want = RefDistribution(row, p, {});
  int kept = 0;
  for (double q : want) kept += q > 0;
  ASSERT_EQ(kept, 5) << "the filters should each cut something here";
  ExpectMatchesDistribution(row, p, {}, 20000);
}

TEST(SamplerTest, FrequenciesMatchWithRepetitionPenalty) {
  const std::vector<float> row = {1.0f, 0.9f, -0.2f, -0.4f, 0.3f, -1.0f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.repetition_penalty = 1.8f;
  p.top_p = 0.95f;
  p.seed = 13;
  ExpectMatchesDistribution(row, p, {0, 2, 0, 5, 2}, 20000);
}

TEST(SamplerTest, SameSeedAndStepGiveSameTokenInAnyBatch) {
  std::mt19937 rng(5);
  const int vocab = 2000;
  SamplingParams pa;
  pa.temperature = 1.0f;
  pa.top_p = 0.95f;
  pa.repetition_penalty = 1.1f;
  pa.seed = 42;
  SamplingParams pb;
  pb.temperature = 0.5f;
  pb.top_k = 20;
  pb.seed = 42;  // same seed, different params and logits: must not matter
  SamplingParams pc = Greedy();
  const std::vector<int32_t> history_a = {1, 2, 3, 500};
  const std::vector<int32_t> history_b = {7, 8};

  Sampler alone, batched;
  std::vector<int32_t> tokens;
  for (uint64_t step = 0; step < 40; ++step) {
    const std::vector<float> a = RandomLogits(vocab, 1, rng);
    const std::vector<float> b = RandomLogits(vocab, 2, rng);
    const std::vector<float> c = RandomLogits(vocab, 2, rng);
    const SampleResult want = SampleSingle(alone, a, pa, step, history_a);
    tokens.push_back(want.token);

    // a at position 2 of 4, then at position 0 of 2, on a Sampler whose
    // scratch holds other sequences' state.
    std::vector<float> logits;
    for (const auto* row : {&b, &c, &a, &b}) logits.insert(logits.end(), row->begin(), row->end());
    SampleInput in4[4] = {{&pb, history_b, step + 3, {}}, {&pc, {}, step, {}}, {&pa, history_a, step, {}},
                          {&pb, history_b, step, {}}};
    SampleResult out4[4];
    ASSERT_TRUE(batched.Sample(logits, vocab, in4, out4).ok());
    EXPECT_EQ(out4[2].token, want.token) << "step " << step;
    EXPECT_EQ(out4[2].logprob, want.logprob);

    logits.assign(a.begin(), a.end());
    logits.insert(logits.end(), c.begin(), c.end());
    SampleInput in2[2] = {{&pa, history_a, step, {}}, {&pb, history_b, step, {}}};
    SampleResult out2[2];
    ASSERT_TRUE(batched.Sample(logits, vocab, in2, out2).ok());
    EXPECT_EQ(out2[0].token, want.token) << "step " << step;
  }
  // The stream is a real draw, not a constant.
  EXPECT_GT(std::set<int32_t>(tokens.begin(), tokens.end()).size(), 20u);
}

TEST(SamplerTest, DifferentSeedsGiveDifferentStreams) {
  const std::vector<float> flat(1000, 0.0f);
  Sampler sampler;
  SamplingParams p1, p2;
  p1.seed = 1;
  p2.seed = 2;
  int same = 0, repeats = 0;
  int32_t previous = -1;
  for (uint64_t step = 0; step < 100; ++step) {
    const int32_t t1 = SampleSingle(sampler, flat, p1, step).token;
    same += t1 == SampleSingle(sampler, flat, p2, step).token;
    repeats += t1 == previous;
    previous = t1;
  }
  // Independent uniform draws over 1000 tokens agree about 0.1 times in 100.
  EXPECT_LE(same, 3);
  EXPECT_LE(repeats, 3);
}

TEST(UniformForStepTest, InUnitIntervalAndSpread) {
  double sum = 0;
  int low = 0;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    for (uint64_t step = 0; step < 100; ++step) {
      const double u = UniformForStep(seed, step);
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      sum += u;
      low += u < 0.01;
    }
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
  EXPECT_NEAR(low, 100, 40);
  EXPECT_NE(UniformForStep(1, 2), UniformForStep(2, 1));
}

TEST(SamplerTest, RepetitionPenaltyFollowsHuggingFace) {
  Sampler sampler;
  SamplingParams p = Greedy();
  p.repetition_penalty = 1.2f;
  // Positive logit divided: 2.0 / 1.2 = 1.67 < 1.9.
  EXPECT_EQ(SampleSingle(sampler, {2.0f, 1.9f, -5.0f}, p, 0, {0}).token, 1);
  EXPECT_EQ(SampleSingle(sampler, {2.0f, 1.9f, -5.0f}, p, 0, {2}).token, 0);
  // Negative logit multiplied (dividing would raise it): -1.0 * 1.5 = -1.5 < -1.2.
  p.repetition_penalty = 1.5f;
  EXPECT_EQ(SampleSingle(sampler, {-1.0f, -1.2f, -5.0f}, p, 0, {0}).token, 1);
  // A penalty below 1 rewards repeats: 1.0 / 0.5 = 2.0 > 1.5.
  p.repetition_penalty = 0.5f;
  EXPECT_EQ(SampleSingle(sampler, {1.0f, 1.5f}, p, 0, {0}).token, 0);
  // Repeats in history count once: 3.0 / 1.1 = 2.73 > 2.5 (1.1^3 would flip it).
  p.repetition_penalty = 1.1f;
  EXPECT_EQ(SampleSingle(sampler, {3.0f, 2.5f}, p, 0, {0, 0, 0}).token, 0);
  // The logprob stays that of the raw logits.
  const std::vector<float> row = {2.0f, 1.9f, -5.0f};
  p.repetition_penalty = 1.2f;
  EXPECT_NEAR(SampleSingle(sampler, row, p, 0, {0}).logprob, RefLogProb(row, 1), 1e-6);
  // The penalty does not leak into the next call (marks are cleared).
  EXPECT_EQ(SampleSingle(sampler, {2.0f, 1.9f, -5.0f}, Greedy(), 0, {0}).token, 0);
  EXPECT_EQ(SampleSingle(sampler, {2.0f, 1.9f, -5.0f}, p, 0, {}).token, 0);
}

// Finding 1 of the reliability issue: repetition_penalty = 1e-38 turned a
// repeated positive logit into +inf and failed the whole step. Any valid
// penalty now samples: overflows clamp to +-FLT_MAX.
TEST(SamplerTest, ExtremePenaltiesNeverFailARow) {
  Sampler sampler;
  const std::vector<float> row = {5.0f, 1.0f, -3.0f, 0.5f, -kInf};
  for (const float penalty : {1e-38f, 1e-30f, 1e30f, 3e38f}) {
    for (const float temperature : {0.0f, 0.7f, 1.0f}) {
      SamplingParams p;
      p.temperature = temperature;
      p.repetition_penalty = penalty;
      p.top_p = 0.9f;
      SCOPED_TRACE(testing::Message() << "penalty " << penalty << " temperature " << temperature);
      for (uint64_t step = 0; step < 20; ++step) {
        const SampleResult r = SampleSingle(sampler, row, p, step, {0, 2, 4});
        ASSERT_GE(r.token, 0);
        ASSERT_LT(r.token, 4);  // never the -inf token
        EXPECT_TRUE(std::isfinite(r.logprob));
        // A tiny penalty rewards the repeated positive logit past everything.
        if (penalty < 1) EXPECT_EQ(r.token, 0);
        // A huge one sends the repeated negative logit to -FLT_MAX, never
        // -inf's "impossible": it still has no chance against finite rows.
        if (penalty > 1) EXPECT_NE(r.token, 2);
      }
    }
  }
}

TEST(SamplerTest, NaNCountsAsMinusInf) {
  Sampler sampler;
  const std::vector<float> row = {kNaN, 1.0f, 2.0f, kNaN, -kInf};
  const SampleResult g = SampleSingle(sampler, row, Greedy(), 0);
  EXPECT_EQ(g.token, 2);
  EXPECT_NEAR(g.logprob, std::log(std::exp(2.0) / (std::exp(1.0) + std::exp(2.0))), 1e-6);
  SamplingParams p;
  p.temperature = 10;
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 100; ++step) {
    const SampleResult r = SampleSingle(sampler, row, p, step);
    seen.insert(r.token);
    EXPECT_TRUE(std::isfinite(r.logprob));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2}));
}

TEST(SamplerTest, RejectsRowsWithoutAFiniteLogitOrWithPlusInf) {
  Sampler sampler;
  const SamplingParams params[2] = {SamplingParams{}, Greedy()};
  for (const SamplingParams* p : {&params[0], &params[1]}) {
    const std::vector<float> logits = {0.0f, 1.0f, kNaN, -kInf, kNaN, kNaN, 0.0f, kInf, 1.0f};
    SampleInput inputs[3] = {In(p), In(p), In(p)};
    SampleResult out[3];
    absl::Status status = sampler.Sample(logits, 3, inputs, out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("sequence 1 are all -inf or NaN"), std::string::npos) << status;
    status = sampler.Sample(absl::MakeConstSpan(logits).subspan(6), 3, {inputs, 1}, {out, 1});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("+inf"), std::string::npos) << status;
  }
}

TEST(SamplerTest, TinyTemperatureActsGreedy) {
  std::mt19937 rng(6);
  Sampler sampler;
  SamplingParams p;
  p.temperature = 1e-30f;  // (logit - max) / T overflows unless shifted first
  for (uint64_t step = 0; step < 20; ++step) {
    const std::vector<float> row = RandomLogits(100, 1, rng);
    EXPECT_EQ(SampleSingle(sampler, row, p, step).token, SampleSingle(sampler, row, Greedy(), 0).token);
  }
}

TEST(SamplerTest, RejectsBadSizesAndHistory) {
  Sampler sampler;
  const SamplingParams greedy = Greedy();
  const std::vector<float> logits(6, 0.0f);
  SampleInput inputs[2] = {In(&greedy), In(&greedy)};
  SampleResult out[2];
  EXPECT_TRUE(sampler.Sample(logits, 3, inputs, out).ok());
  EXPECT_TRUE(sampler.Sample({}, 3, {}, {}).ok());

  auto expect_invalid = [](const absl::Status& status, const std::string& needle) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status;
  };
  expect_invalid(sampler.Sample(logits, 0, inputs, out), "vocab");
  expect_invalid(sampler.Sample(logits, 4, inputs, out), "logits");
  expect_invalid(sampler.Sample(logits, 2, inputs, out), "logits");
  expect_invalid(sampler.Sample(logits, 3, inputs, {out, 1}), "out");
  SampleInput null_params[2] = {In(&greedy), In(nullptr)};
  expect_invalid(sampler.Sample(logits, 3, null_params, out), "sequence 1: params is null");

  SamplingParams penalized = Greedy();
  penalized.repetition_penalty = 1.2f;
  const std::vector<int32_t> bad_history = {0, 3};
  SampleInput with_history[2] = {In(&penalized, bad_history), In(&greedy)};
  expect_invalid(sampler.Sample(logits, 3, with_history, out), "history token 3");
  // History is not read without a penalty.
  SampleInput unread_history[2] = {In(&greedy, bad_history), In(&greedy)};
  EXPECT_TRUE(sampler.Sample(logits, 3, unread_history, out).ok());
}

// The min(n, vocab) largest raw logits (NaN as -inf), ties to the lower id,
// with float64 log-softmax values.
std::vector<std::pair<int32_t, double>> RefTop(const std::vector<float>& row, int n) {
  const int vocab = static_cast<int>(row.size());
  std::vector<double> y(vocab);
  for (int i = 0; i < vocab; ++i) y[i] = std::isnan(row[i]) ? -INFINITY : row[i];
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return y[a] > y[b]; });
  std::vector<std::pair<int32_t, double>> top;
  for (int j = 0; j < std::min(n, vocab); ++j) {
    const int32_t id = order[j];
    top.emplace_back(id, std::isinf(y[id]) ? -INFINITY : RefLogProb(row, id));
  }
  return top;
}

// A row with ties (logits on a coarse grid), -inf and NaN entries, and at
// least one finite logit.
std::vector<float> RowWithTiesAndHoles(int vocab, std::mt19937& rng) {
  std::vector<float> row(vocab);
  const int grid = 1 + static_cast<int>(rng() % 40);  // few distinct values: many ties
  for (float& x : row) {
    const uint32_t kind = rng() % 20;
    x = kind == 0 ? -kInf : kind == 1 ? kNaN : static_cast<float>(static_cast<int>(rng() % grid) - grid / 2) * 0.75f;
  }
  row[rng() % vocab] = 1.5f;  // one finite logit at least
  return row;
}

TEST(SamplerTest, TopLogprobsMatchAFloat64Reference) {
  std::mt19937 rng(20);
  Sampler sampler;
  const int vocabs[] = {1, 3, 19, 20, 21, 257, 1024, 3001};
  int seen_short = 0, seen_holes = 0;
  for (int iter = 0; iter < 600; ++iter) {
    const int vocab = vocabs[iter % 8];
    const std::vector<float> row = iter % 3 == 0 ? RandomLogits(vocab, 4, rng) : RowWithTiesAndHoles(vocab, rng);
    SamplingParams p;
    const int ns[] = {1, 20, 1 + static_cast<int>(rng() % kMaxTopLogprobs)};
    p.top_logprobs = ns[iter % 3];
    switch (iter % 4) {  // the filters and the penalty must not change the top entries
      case 0:
        p.temperature = 0;
        break;
      case 1:
        p.temperature = 0.7f;
        p.top_k = 5;
        p.top_p = 0.9f;
        break;
      case 2:
        p.temperature = 0;
        p.repetition_penalty = 1.5f;
        break;
      default:
        p.temperature = 1.3f;
        p.min_p = 0.05f;
        p.repetition_penalty = 0.8f;
        break;
    }
    std::vector<int32_t> history;
    for (int k = 0; k < 5; ++k) history.push_back(static_cast<int32_t>(rng() % vocab));
    const SampleResult r = SampleSingle(sampler, row, p, iter, history);
    const auto want = RefTop(row, p.top_logprobs);
    const std::string where = absl::StrFormat("iter %d vocab %d n %d", iter, vocab, p.top_logprobs);
    ASSERT_EQ(r.top.size, static_cast<int32_t>(want.size())) << where;
    seen_short += vocab < p.top_logprobs;
    for (int j = 0; j < r.top.size; ++j) {
      EXPECT_EQ(r.top.ids[j], want[j].first) << where << " entry " << j;
      if (std::isinf(want[j].second)) {
        EXPECT_EQ(r.top.logprobs[j], -kInf) << where << " entry " << j;
        ++seen_holes;
      } else {
        EXPECT_NEAR(r.top.logprobs[j], want[j].second, 2e-5 * std::max(1.0, std::abs(want[j].second)))
            << where << " entry " << j;
      }
      if (j > 0) {
        EXPECT_LE(r.top.logprobs[j], r.top.logprobs[j - 1]) << where;
      }
      if (r.top.ids[j] == r.token) {  // the sampled token's entry is its logprob, to the bit
        EXPECT_EQ(r.top.logprobs[j], r.logprob) << where;
      }
    }
    // The free function (the GPU models' host fallback) agrees to the bit.
    TopTokens alone;
    ASSERT_TRUE(TopLogprobsOfRow(row.data(), vocab, {}, p.top_logprobs, &alone)) << where;
    ASSERT_EQ(alone.size, r.top.size) << where;
    for (int j = 0; j < alone.size; ++j) {
      EXPECT_EQ(alone.ids[j], r.top.ids[j]) << where;
      EXPECT_EQ(alone.logprobs[j], r.top.logprobs[j]) << where;
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(seen_short, 0);
  EXPECT_GT(seen_holes, 0);
}

TEST(SamplerTest, GreedyTokenLeadsItsTopLogprobs) {
  std::mt19937 rng(21);
  Sampler sampler;
  SamplingParams p = Greedy();
  p.top_logprobs = 5;
  for (int iter = 0; iter < 50; ++iter) {
    const std::vector<float> row = RowWithTiesAndHoles(500, rng);
    const SampleResult r = SampleSingle(sampler, row, p, 0);
    ASSERT_EQ(r.top.size, 5);
    EXPECT_EQ(r.top.ids[0], r.token);
    EXPECT_EQ(r.top.logprobs[0], r.logprob);
  }
}

TEST(SamplerTest, NoTopLogprobsUnlessAsked) {
  Sampler sampler;
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, 3.0f, 1.0f};
  SamplingParams with = Greedy(), without = Greedy();
  with.top_logprobs = 2;
  SampleInput inputs[2] = {In(&with), In(&without)};
  SampleResult out[2];
  out[1].top.size = 7;  // a reused result: the stale entries must go
  ASSERT_TRUE(sampler.Sample(logits, 3, inputs, out).ok());
  EXPECT_EQ(out[0].top.size, 2);
  EXPECT_EQ(out[0].top.ids[0], 1);  // row 0 is {0, 2, 1}
  EXPECT_EQ(out[0].top.ids[1], 2);
  EXPECT_EQ(out[1].top.size, 0);
}

TEST(SamplerTest, TopLogprobsOfRowRefusesWhatTheSamplerRefuses) {
  TopTokens top;
  const std::vector<float> none = {-kInf, kNaN, -kInf};
  EXPECT_FALSE(TopLogprobsOfRow(none.data(), 3, {}, 2, &top));
  EXPECT_EQ(top.size, 0);
  const std::vector<float> plus_inf = {0.0f, kInf, 1.0f};
  EXPECT_FALSE(TopLogprobsOfRow(plus_inf.data(), 3, {}, 2, &top));
  EXPECT_EQ(top.size, 0);
  const std::vector<float> fine = {kNaN, -kInf, 1.0f};
  ASSERT_TRUE(TopLogprobsOfRow(fine.data(), 3, {}, 3, &top));
  ASSERT_EQ(top.size, 3);
  EXPECT_EQ(top.ids[0], 2);
  EXPECT_EQ(top.logprobs[0], 0.0f);
  EXPECT_EQ(top.ids[1], 0);  // NaN counts as -inf: ties go to the lower id
  EXPECT_EQ(top.logprobs[1], -kInf);
  EXPECT_EQ(top.ids[2], 1);
}

// ---------------------------------------------------------------------------
// Token masks (SampleInput::allowed).

using sampler_testing::MaskAllows;
using sampler_testing::MaskedByHand;
using sampler_testing::RandomTokenMask;

// One of the sampler's paths: greedy (with or without a penalty), temperature
// alone, top-k, top-p over the whole row, min-p, all of them; sometimes with
// top_logprobs.
SamplingParams MaskTestParams(std::mt19937& rng) {
  SamplingParams p;
  switch (rng() % 8) {
    case 0:
      p.temperature = 0;
      break;
    case 1:
      p.temperature = 0;
      p.repetition_penalty = 1.3f;
      break;
    case 2:
      p.temperature = 0.7f;
      p.top_k = 1;  // greedy too
      break;
    case 3:
      p.temperature = 0.7f;
      break;
    case 4:
      p.temperature = 1.0f;
      p.top_k = 1 + static_cast<int>(rng() % 8);
      break;
    case 5:
      p.temperature = 1.2f;
      p.top_p = 0.8f;
      break;
    case 6:
      p.temperature = 1.0f;
      p.min_p = 0.1f;
      break;
    default:
      p.temperature = 0.9f;
      p.top_k = 40;
      p.top_p = 0.9f;
      p.min_p = 0.02f;
      p.repetition_penalty = 0.8f;
      break;
  }
  p.seed = rng();
  p.top_logprobs = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % kMaxTopLogprobs) : 0;
  return p;
}

// A mask is exactly the row with its disallowed logits at -inf: the same
// status, tokens, logprobs and top entries to the bit, over every path,
// dense and sparse masks, masks shorter than the vocabulary, vocabularies
// off a multiple of 32, and +inf, NaN or -inf logits under the mask.
TEST(SamplerMaskTest, MaskedRowsSampleAsRowsMaskedByHand) {
  std::mt19937 rng(30);
  Sampler with_mask, by_hand;
  const int vocabs[] = {1, 5, 31, 33, 97, 1000, 1025, 2049, 4099};
  int compared = 0, refused = 0, short_masks = 0;
  for (int iter = 0; iter < 500; ++iter) {
    const int vocab = vocabs[iter % 9];
    const int n = 1 + static_cast<int>(rng() % 3);
    std::vector<SamplingParams> params(n);
    std::vector<std::vector<int32_t>> history(n);
    std::vector<std::vector<uint32_t>> masks(n);
    std::vector<float> logits, hand_logits;
    for (int s = 0; s < n; ++s) {
      params[s] = MaskTestParams(rng);
      for (int k = 0; k < 6; ++k) history[s].push_back(static_cast<int32_t>(rng() % vocab));
      masks[s] = RandomTokenMask(vocab, rng);
      short_masks += masks[s].size() < static_cast<size_t>((vocab + 31) / 32);
      std::vector<float> row = iter % 2 ? RandomLogits(vocab, 3, rng) : RowWithTiesAndHoles(vocab, rng);
      // A +inf the mask hides fails nothing; one it lets through fails both.
      const int t = static_cast<int>(rng() % vocab);
      if (rng() % 4 == 0 && (!MaskAllows(masks[s], t) || rng() % 8 == 0)) row[t] = kInf;
      const std::vector<float> hand = MaskedByHand(row, masks[s]);
      logits.insert(logits.end(), row.begin(), row.end());
      hand_logits.insert(hand_logits.end(), hand.begin(), hand.end());
    }
    std::vector<SampleInput> masked(n), plain(n);
    for (int s = 0; s < n; ++s) {
      plain[s] = In(&params[s], history[s], iter);
      masked[s] = plain[s];
      masked[s].allowed = masks[s];
    }
    std::vector<SampleResult> got(n), want(n);
    const absl::Status st = with_mask.Sample(logits, vocab, masked, absl::MakeSpan(got));
    const absl::Status want_st = by_hand.Sample(hand_logits, vocab, plain, absl::MakeSpan(want));
    const std::string where = absl::StrFormat("iter %d vocab %d", iter, vocab);
    ASSERT_EQ(st, want_st) << where;
    if (!st.ok()) {
      ++refused;
      continue;
    }
    for (int s = 0; s < n; ++s) {
      const SamplingParams& p = params[s];
      const std::string what = absl::StrFormat("%s seq %d: T %g top_k %d top_p %g min_p %g penalty %g mask %d words",
                                               where, s, p.temperature, p.top_k, p.top_p, p.min_p,
                                               p.repetition_penalty, masks[s].size());
      EXPECT_EQ(got[s].token, want[s].token) << what;
      EXPECT_TRUE(MaskAllows(masks[s], got[s].token)) << what;
      EXPECT_EQ(got[s].logprob, want[s].logprob) << what;
      ASSERT_EQ(got[s].top.size, want[s].top.size) << what;
      TopTokens alone;  // the GPU models' host fallback, under the mask
      ASSERT_TRUE(TopLogprobsOfRow(logits.data() + static_cast<size_t>(s) * vocab, vocab, masks[s],
                                   p.top_logprobs, &alone))
          << what;
      ASSERT_EQ(alone.size, want[s].top.size) << what;
      for (int j = 0; j < want[s].top.size; ++j) {
        EXPECT_EQ(got[s].top.ids[j], want[s].top.ids[j]) << what << " entry " << j;
        EXPECT_EQ(got[s].top.logprobs[j], want[s].top.logprobs[j]) << what << " entry " << j;
        EXPECT_EQ(alone.ids[j], want[s].top.ids[j]) << what << " entry " << j;
        EXPECT_EQ(alone.logprobs[j], want[s].top.logprobs[j]) << what << " entry " << j;
      }
      ++compared;
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(compared, 500);
  EXPECT_GT(refused, 10);  // rows whose allowed logits are all -inf or NaN, or an allowed +inf
  EXPECT_GT(short_masks, 50);
}

// Without a mask, or with one that allows every token, nothing changes.
TEST(SamplerMaskTest, AFullOrEmptyMaskChangesNothing) {
  std::mt19937 rng(31);
  Sampler sampler;
  for (int iter = 0; iter < 100; ++iter) {
    const int vocab = 1 + static_cast<int>(rng() % 3000);
    const std::vector<float> row = RowWithTiesAndHoles(vocab, rng);
    const SamplingParams p = MaskTestParams(rng);
    const std::vector<uint32_t> full((vocab + 31) / 32, ~uint32_t{0});
    SampleInput in = In(&p, {}, iter);
    SampleResult plain, masked;
    ASSERT_TRUE(sampler.Sample(row, vocab, {&in, 1}, {&plain, 1}).ok());
    in.allowed = full;
    ASSERT_TRUE(sampler.Sample(row, vocab, {&in, 1}, {&masked, 1}).ok());
    EXPECT_EQ(masked.token, plain.token) << "iter " << iter;
    EXPECT_EQ(masked.logprob, plain.logprob) << "iter " << iter;
  }
}

TEST(SamplerMaskTest, RefusesALongMaskAndRowsWithNothingAllowed) {
  Sampler sampler;
  const int vocab = 33;  // two words, the second with one token
  std::vector<float> logits(2 * vocab, 0.0f);
  logits[vocab + 5] = kNaN;
  logits[vocab + 6] = -kInf;
  logits[vocab + 7] = kInf;
  SamplingParams greedy = Greedy(), hot;
  hot.temperature = 1;
  for (const SamplingParams* p : {&greedy, &hot}) {
    const std::string where = p->temperature == 0 ? "greedy" : "sampled";
    auto sample = [&](std::vector<uint32_t> mask) {
      SampleInput in[2] = {In(p), In(p)};
      in[1].allowed = mask;
      SampleResult out[2];
      return sampler.Sample(logits, vocab, in, out);
    };
    const absl::Status long_mask = sample({~uint32_t{0}, 1, 0});
    EXPECT_EQ(long_mask.code(), absl::StatusCode::kInvalidArgument) << where;
    EXPECT_NE(long_mask.message().find("sequence 1"), std::string::npos) << long_mask;
    EXPECT_NE(long_mask.message().find("token mask of 3 words"), std::string::npos) << long_mask;
    EXPECT_TRUE(sample({0, 1}).ok()) << where << ": token 32 alone";
    // Nothing allowed, only tokens past the vocabulary, only NaN and -inf:
    // the row has no finite logit.
    for (const std::vector<uint32_t>& none :
         {std::vector<uint32_t>{0, 0}, std::vector<uint32_t>{0, ~uint32_t{1}}, std::vector<uint32_t>{0x60}}) {
      const absl::Status st = sample(none);
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << where;
      EXPECT_NE(st.message().find("sequence 1 are all -inf or NaN"), std::string::npos) << st;
    }
    // A +inf is refused only where the mask lets it through.
    EXPECT_TRUE(sample({0x100}).ok()) << where << ": the +inf hidden";
    const absl::Status plus_inf = sample({0x80});
    EXPECT_NE(plus_inf.message().find("sequence 1 contain +inf"), std::string::npos) << plus_inf;
  }
}

TEST(SamplerMaskTest, ValidatesMaskSizesAndFindsAllowedTokens) {
  EXPECT_TRUE(ValidateAllowedTokens({}, 5).ok());
  EXPECT_TRUE(ValidateAllowedTokens(std::vector<uint32_t>(2), 64).ok());
  EXPECT_EQ(ValidateAllowedTokens(std::vector<uint32_t>(3), 64).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateAllowedTokens(std::vector<uint32_t>(3), 65).ok());
  EXPECT_EQ(ValidateAllowedTokens(std::vector<uint32_t>(1), 0).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(AllowsSomeToken({}, 5));
  EXPECT_FALSE(AllowsSomeToken(std::vector<uint32_t>{0, 0}, 64));
  EXPECT_TRUE(AllowsSomeToken(std::vector<uint32_t>{0, 1u << 31}, 64));  // token 63
  EXPECT_FALSE(AllowsSomeToken(std::vector<uint32_t>{0, 2}, 33));        // token 33: past the vocabulary
  EXPECT_TRUE(AllowsSomeToken(std::vector<uint32_t>{0, 1}, 33));         // token 32
  EXPECT_TRUE(AllowsSomeToken(std::vector<uint32_t>{1}, 100));           // shorter than the vocabulary
  EXPECT_FALSE(AllowsSomeToken(std::vector<uint32_t>{~uint32_t{0} << 5}, 5));
}

}  // namespace
}  // namespace chunkattn
