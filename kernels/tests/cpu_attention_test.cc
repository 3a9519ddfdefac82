// CPU attention kernels against the float64 oracle over random forests.
//
// Tolerances (max |kernel - oracle| over all outputs; outputs are O(1)):
//  * against the oracle reading the pool as stored: 3e-5 for every dtype:
//    storage rounding is shared, so this measures fp32 arithmetic alone;
//  * against the oracle on the fp32 values before storage: fp32 3e-5,
//    fp16 1.5e-2, bf16 1e-1: the cost of the storage dtype itself
//    (10 and 7 mantissa bits, scores amplified by sharp softmaxes).
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "absl/strings/str_format.h"
#include "base/sanitizer.h"
#include "kernels/api/attention_state.h"
#include "kernels/cpu/reference.h"
#include "kernels/tests/attention_test_util.h"
#include "kernels/tests/random_forest.h"

namespace chunkattn::cpu {
namespace {

using testing::ForestOptions;
using testing::RandomForest;
using testing::Isas;
using testing::MaxDiff;
using testing::RandomVector;
using testing::TestPool;

constexpr double kArithmeticTol = 3e-5;

double StorageTol(DType t) {
  switch (t) {
    case DType::kFloat32: return kArithmeticTol;
    case DType::kFloat16: return 1.5e-2;
    case DType::kBFloat16: return 1e-1;
  }
  return 0;
}

using Params = testing::KernelParams;

class DecodeParity : public ::testing::TestWithParam<Params> {};

TEST_P(DecodeParity, TppAndSeqMatchTheOracleOnRandomForests) {
  const auto [dtype, d, g, c] = GetParam();
  const int kvh = 2;
  AttentionShape shape{kvh * g, kvh, d, 0};
  ThreadPool pool(3);
  ForestOptions opt;
  std::mt19937 rng(d * 1000 + g * 10 + c + static_cast<int>(dtype));
  for (int trial = 0; trial < SanitizerSlice(4, 2); ++trial) {  // a sharp and a flat softmax at least
    SCOPED_TRACE(absl::StrFormat("trial %d", trial));
    TestPool kv(dtype, testing::MaxForestChunks(opt), kvh, c, d);
    const ChunkContext ctx = RandomForest(rng, kv, opt);
    ASSERT_TRUE(ValidateChunkContext(ctx, kv.view.num_chunks).ok());
    // Sharp and flat softmaxes: scores up to ~4 sigma * qscale.
    const float qscale = trial % 2 ? 3.0f : 0.7f;
    const std::vector<float> q = RandomVector(rng, int64_t{ctx.num_seqs()} * shape.num_heads * d, qscale);
    const std::vector<double> want = ReferenceDecode(ctx, kv.view, shape, q.data());
    const std::vector<double> want_unrounded = ReferenceDecode(ctx, kv.original_view, shape, q.data());
    absl::StatusOr<DecodePlan> plan = PlanDecode(ctx, kv.view.num_chunks);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (Isa isa : Isas()) {
      CpuAttention attn(&pool, isa);
      for (DecodeImpl impl : {DecodeImpl::kTpp, DecodeImpl::kSequence}) {
        SCOPED_TRACE(absl::StrFormat("%s %s, %d seqs, %d shared entries", IsaName(isa), DecodeImplName(impl),
                                     ctx.num_seqs(), ctx.num_shared()));
        std::vector<float> o(q.size(), NAN);
        ASSERT_TRUE(attn.Decode(impl, *plan, ctx, kv.view, shape, q.data(), o.data()).ok());
        EXPECT_LE(MaxDiff(o, want), kArithmeticTol);
        EXPECT_LE(MaxDiff(o, want_unrounded), StorageTol(dtype));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, DecodeParity, testing::ParitySweep(), testing::KernelParamName);

// The other chunk sizes the cache accepts, and an unusual head dim (under
// ThreadSanitizer that head dim, and the smallest and largest chunk).
INSTANTIATE_TEST_SUITE_P(
    ChunkSizes, DecodeParity,
    ::testing::Combine(::testing::Values(DType::kFloat16),
                       ::testing::ValuesIn(kThreadSanitizerBuild ? std::vector<int>{32} : std::vector<int>{32, 128}),
                       ::testing::Values(4),
                       ::testing::ValuesIn(kThreadSanitizerBuild ? std::vector<int>{32, 256}
                                                                 : std::vector<int>{32, 128, 256})),
    testing::KernelParamName);

TEST(DecodeTest, BatchOfOneWithOnlyPrivateChunks) {
  TestPool kv(DType::kFloat32, 8, 1, 16, 64);
  std::mt19937 rng(7);
  ChunkContext ctx;
  ctx.chunk_size = 16;
  ctx.seq_ids = {1};
  ctx.seq_len = {16 + 16 + 5};
  ctx.private_begin = {0};
  ctx.private_end = {3};
  ctx.private_chunk = {6, 2, 4};
  ctx.private_tokens = {16, 16, 5};
  kv.Fill(rng, 6, 16);
  kv.Fill(rng, 2, 16);
  kv.Fill(rng, 4, 5);
  AttentionShape shape{1, 1, 64, 0};
  const std::vector<float> q = RandomVector(rng, 64, 1.0f);
  absl::StatusOr<DecodePlan> plan = PlanDecode(ctx, 8);
  ASSERT_TRUE(plan.ok());
  for (Isa isa : Isas()) {
    CpuAttention attn(nullptr, isa);
    std::vector<float> o(64, NAN);
    ASSERT_TRUE(attn.Decode(DecodeImpl::kTpp, *plan, ctx, kv.view, shape, q.data(), o.data()).ok());
    EXPECT_LE(MaxDiff(o, ReferenceDecode(ctx, kv.view, shape, q.data())), kArithmeticTol);
  }
}

// Token counts change every step without a new plan (append-only steps).
TEST(DecodeTest, PlanSurvivesAppendOnlySteps) {
  TestPool kv(DType::kFloat16, 8, 2, 16, 64);
  std::mt19937 rng(8);
  ChunkContext ctx;
  ctx.chunk_size = 16;
  ctx.version = 3;
  ctx.seq_ids = {1, 2};
  ctx.shared_chunk = {5};
  ctx.shared_begin = {0};
  ctx.shared_end = {2};
  ctx.shared_tokens = {16};
  ctx.private_begin = {0, 2};
  ctx.private_end = {1, 3};
  ctx.private_chunk = {1, -1, 3, -1};
  ctx.private_tokens = {1, 0, 1, 0};
  ctx.seq_len = {17, 17};
  kv.Fill(rng, 5, 16);
  kv.Fill(rng, 1, 16);
  kv.Fill(rng, 3, 16);
  const absl::StatusOr<DecodePlan> plan = PlanDecode(ctx, 8);
  ASSERT_TRUE(plan.ok());
  AttentionShape shape{2, 2, 64, 0};
  CpuAttention attn(nullptr);
  for (int step = 1; step <= 16; ++step) {
    ctx.private_tokens = {step, 0, step, 0};
    ctx.seq_len = {16 + step, 16 + step};
    const std::vector<float> q = RandomVector(rng, 2 * 2 * 64, 2.0f);
    std::vector<float> o(q.size(), NAN);
    ASSERT_TRUE(attn.Decode(DecodeImpl::kTpp, *plan, ctx, kv.view, shape, q.data(), o.data()).ok());
    EXPECT_LE(MaxDiff(o, ReferenceDecode(ctx, kv.view, shape, q.data())), kArithmeticTol) << "step " << step;
  }
}

TEST(DecodeTest, ThreadCountDoesNotChangeTheBits) {
  ForestOptions opt;
  opt.max_seqs = 16;
  TestPool kv(DType::kBFloat16, testing::MaxForestChunks(opt), 2, 16, 128);
  std::mt19937 rng(9);
  const ChunkContext ctx = RandomForest(rng, kv, opt);
  AttentionShape shape{8, 2, 128, 0};
  const std::vector<float> q = RandomVector(rng, int64_t{ctx.num_seqs()} * 8 * 128, 1.0f);
  const absl::StatusOr<DecodePlan> plan = PlanDecode(ctx, kv.view.num_chunks);
  ASSERT_TRUE(plan.ok());
  ThreadPool one(1), four(4);
  CpuAttention a(&one), b(&four);
  std::vector<float> oa(q.size()), ob(q.size());
  for (DecodeImpl impl : {DecodeImpl::kTpp, DecodeImpl::kSequence}) {
    ASSERT_TRUE(a.Decode(impl, *plan, ctx, kv.view, shape, q.data(), oa.data()).ok());
    ASSERT_TRUE(b.Decode(impl, *plan, ctx, kv.view, shape, q.data(), ob.data()).ok());
    EXPECT_EQ(oa, ob);
  }
}

TEST(NaiveTest, MatchesTheOracle) {
  ForestOptions opt;
  TestPool kv(DType::kFloat16, testing::MaxForestChunks(opt), 2, 16, 64);
  std::mt19937 rng(10);
  const ChunkContext ctx = RandomForest(rng, kv, opt);
  AttentionShape shape{8, 2, 64, 0};
  const std::vector<float> q = RandomVector(rng, int64_t{ctx.num_seqs()} * 8 * 64, 2.0f);
  absl::StatusOr<DenseKv> dense = GatherDense(ctx, kv.view);
  ASSERT_TRUE(dense.ok()) << dense.status();
  ThreadPool pool(2);
  for (Isa isa : Isas()) {
    std::vector<float> o(q.size(), NAN);
    ASSERT_TRUE(NaiveDecode(*dense, shape, q.data(), o.data(), &pool, isa).ok());
    EXPECT_LE(MaxDiff(o, ReferenceDecode(ctx, kv.view, shape, q.data())), kArithmeticTol) << IsaName(isa);
  }
}

// merge(attn(prefix), attn(suffix)) == attn(prefix + suffix), in float64 and
// in the float32 primitive the kernels use.
TEST(CascadeTest, MergingPrefixAndSuffixStatesEqualsAttentionOverBoth) {
  std::mt19937 rng(11);
  const int d = 64;
  for (int trial = 0; trial < 200; ++trial) {
    const int len = std::uniform_int_distribution<int>(2, 300)(rng);
    const int split = std::uniform_int_distribution<int>(1, len - 1)(rng);
    std::vector<double> q(d), k(int64_t{len} * d), v(int64_t{len} * d);
    std::normal_distribution<double> normal;
    const double qscale = trial % 3 + 0.5;
    for (double& x : q) x = qscale * normal(rng);
    for (double& x : k) x = normal(rng);
    for (double& x : v) x = normal(rng);
    const double scale = 1 / std::sqrt(double{d});
    const RefState all = ReferenceState(q.data(), k.data(), v.data(), len, d, scale);
    RefState pre = ReferenceState(q.data(), k.data(), v.data(), split, d, scale);
    const RefState suf =
        ReferenceState(q.data(), k.data() + int64_t{split} * d, v.data() + int64_t{split} * d, len - split, d, scale);
    // Float32 copies of the two halves, merged in the other order.
    std::vector<float> of(suf.o.begin(), suf.o.end()), pf(pre.o.begin(), pre.o.end());
    float mf = static_cast<float>(suf.m), nf = static_cast<float>(suf.n);
    MergeState(of.data(), &mf, &nf, pf.data(), static_cast<float>(pre.m), static_cast<float>(pre.n), d);
    MergeState(pre.o.data(), &pre.m, &pre.n, suf.o.data(), suf.m, suf.n, d);
    EXPECT_DOUBLE_EQ(pre.m, all.m);
    EXPECT_NEAR(pre.n, all.n, 1e-12 * all.n);
    for (int x = 0; x < d; ++x) {
      EXPECT_NEAR(pre.o[x] / pre.n, all.o[x] / all.n, 1e-12);
      EXPECT_NEAR(of[x] / nf, all.o[x] / all.n, 1e-5);
    }
  }
}

TEST(CascadeTest, EmptyStateIsTheIdentity) {
  std::vector<float> o = {1, 2, 3, 4}, empty = {0, 0, 0, 0}, e2 = {0, 0, 0, 0};
  float m = 0.5f, n = 2.0f, em = kEmptyStateMax, en = 0.0f;
  MergeState(o.data(), &m, &n, empty.data(), kEmptyStateMax, 0.0f, 4);
  EXPECT_EQ(o, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(m, 0.5f);
  EXPECT_EQ(n, 2.0f);
  MergeState(e2.data(), &em, &en, o.data(), m, n, 4);
  EXPECT_EQ(e2, o);
  EXPECT_EQ(em, m);
  EXPECT_EQ(en, n);
}

}  // namespace
}  // namespace chunkattn::cpu
