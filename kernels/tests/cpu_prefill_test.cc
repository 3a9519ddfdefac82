// Prefill over chunked KV, KV append/copy, and the decode/prefill agreement.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/reference.h"
#include "kernels/tests/attention_test_util.h"
#include "kernels/tests/random_forest.h"

namespace chunkattn::cpu {
namespace {

using testing::Isas;
using testing::MaxDiff;
using testing::RandomVector;
using testing::TestPool;

constexpr double kTol = 3e-5;

// Flat slots of positions [begin, end) of a sequence on `chunks`.
std::vector<int64_t> Slots(const std::vector<int32_t>& chunks, int c, int64_t begin, int64_t end) {
  std::vector<int64_t> slots;
  for (int64_t p = begin; p < end; ++p) slots.push_back(int64_t{chunks[p / c]} * c + p % c);
  return slots;
}

// Per-token q, k, v of one sequence: q (len, H, d), k/v (len, kvh, d).
struct Tokens {
  std::vector<float> q, k, v;
};

Tokens RandomTokens(std::mt19937& rng, int len, const AttentionShape& s, float qscale) {
  return {RandomVector(rng, int64_t{len} * s.num_heads * s.head_dim, qscale),
          RandomVector(rng, int64_t{len} * s.num_kv_heads * s.head_dim, 1.0f),
          RandomVector(rng, int64_t{len} * s.num_kv_heads * s.head_dim, 1.0f)};
}

using Params = testing::KernelParams;
class PrefillParity : public ::testing::TestWithParam<Params> {};

// A batch of sequences with random matched prefixes and new-token counts.
TEST_P(PrefillParity, MatchesTheOracle) {
  const auto [dtype, d, g, c] = GetParam();
  const int kvh = 2;
  AttentionShape shape{kvh * g, kvh, d, 0};
  std::mt19937 rng(d + g * 7 + c * 13);
  ThreadPool pool(3);
  TestPool kv(dtype, 64, kvh, c, d);
  std::vector<int32_t> ids(64);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  PrefillBatch batch;
  batch.q_begin = {0};
  batch.chunk_begin = {0};
  std::vector<float> q;
  size_t next = 0;
  const int n = uniform(1, 4);
  for (int s = 0; s < n; ++s) {
    const int prefix = uniform(0, 2 * c + 3);
    const int fresh = uniform(1, 2 * c + 5);
    const int len = prefix + fresh;
    std::vector<int32_t> chunks(ids.begin() + next, ids.begin() + next + (len + c - 1) / c);
    next += chunks.size();
    const Tokens t = RandomTokens(rng, len, shape, s % 2 ? 2.5f : 0.8f);
    ASSERT_TRUE(AppendKv(kv.view, t.k.data(), t.v.data(), Slots(chunks, c, 0, len)).ok());
    batch.prefix_len.push_back(prefix);
    batch.q_begin.push_back(batch.q_begin.back() + fresh);
    batch.chunk_ids.insert(batch.chunk_ids.end(), chunks.begin(), chunks.end());
    batch.chunk_begin.push_back(static_cast<int32_t>(batch.chunk_ids.size()));
    q.insert(q.end(), t.q.begin() + int64_t{prefix} * shape.num_heads * d, t.q.end());
  }
  const std::vector<double> want = ReferencePrefill(batch, kv.view, shape, q.data());
  for (Isa isa : Isas()) {
    CpuAttention attn(&pool, isa);
    std::vector<float> o(q.size(), NAN);
    ASSERT_TRUE(attn.Prefill(batch, kv.view, shape, q.data(), o.data()).ok());
    EXPECT_LE(MaxDiff(o, want), kTol) << IsaName(isa);
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, PrefillParity, testing::ParitySweep(), testing::KernelParamName);

// The same tokens through (a) one prefill, (b) a prefill of the first part
// then a prefill that skips it as a matched prefix, (c) token-by-token decode
// from the first token: every position's output agrees.
TEST(PrefillDecodeTest, PrefillThenDecodeEqualsDecodeOnly) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    for (int g : {1, 4}) {
      SCOPED_TRACE(absl::StrFormat("%s group %d", DTypeName(dtype), g));
      const int c = 16, d = 64, kvh = 2, len = 75, split = 37;
      AttentionShape shape{kvh * g, kvh, d, 0};
      const int64_t row = int64_t{shape.num_heads} * d;
      std::mt19937 rng(12 + g);
      TestPool kv(dtype, 16, kvh, c, d);
      const std::vector<int32_t> chunks = {9, 3, 14, 0, 7};
      const Tokens t = RandomTokens(rng, len, shape, 2.0f);
      ASSERT_TRUE(AppendKv(kv.view, t.k.data(), t.v.data(), Slots(chunks, c, 0, len)).ok());
      CpuAttention attn(nullptr);

      std::vector<float> full(t.q.size());
      PrefillBatch whole{{0}, {0, len}, {0, 5}, chunks};
      ASSERT_TRUE(attn.Prefill(whole, kv.view, shape, t.q.data(), full.data()).ok());

      std::vector<float> pieces(t.q.size());
      PrefillBatch first{{0}, {0, split}, {0, 3}, {9, 3, 14}};
      PrefillBatch second{{split}, {0, len - split}, {0, 5}, chunks};
      ASSERT_TRUE(attn.Prefill(first, kv.view, shape, t.q.data(), pieces.data()).ok());
      ASSERT_TRUE(
          attn.Prefill(second, kv.view, shape, t.q.data() + split * row, pieces.data() + split * row).ok());

      std::vector<float> stepped(t.q.size());
      for (int p = 0; p < len; ++p) {
        ChunkContext ctx;
        ctx.chunk_size = c;
        ctx.seq_ids = {1};
        ctx.seq_len = {p + 1};
        const int nc = p / c + 1;
        ctx.private_begin = {0};
        ctx.private_end = {nc};
        ctx.private_chunk.assign(chunks.begin(), chunks.begin() + nc);
        ctx.private_tokens.assign(nc, c);
        ctx.private_tokens.back() = p % c + 1;
        const absl::StatusOr<DecodePlan> plan = PlanDecode(ctx, 16);
        ASSERT_TRUE(plan.ok());
        ASSERT_TRUE(attn.Decode(DecodeImpl::kTpp, *plan, ctx, kv.view, shape, t.q.data() + p * row,
                                stepped.data() + p * row)
                        .ok());
      }
      EXPECT_LE(MaxDiff(pieces, full), kTol);
      EXPECT_LE(MaxDiff(stepped, full), kTol);
      EXPECT_LE(MaxDiff(full, ReferencePrefill(whole, kv.view, shape, t.q.data())), kTol);
    }
  }
}

// Two sequences share a prompt's first two chunks; the second prefills only
// its own suffix (the shared KV is never recomputed). A TPP decode step then
// matches the oracle on the resulting shared layout.
TEST(PrefillDecodeTest, SharedPrefixSkippedByPrefillFeedsTppDecode) {
  const int c = 16, d = 64, kvh = 1;
  AttentionShape shape{4, kvh, d, 0};
  const int64_t row = int64_t{shape.num_heads} * d;
  std::mt19937 rng(13);
  TestPool kv(DType::kFloat16, 16, kvh, c, d);
  const Tokens a = RandomTokens(rng, 40, shape, 1.5f);  // shared 32 + own 8
  const Tokens b = RandomTokens(rng, 45, shape, 1.5f);  // shared 32 + own 13
  ASSERT_TRUE(AppendKv(kv.view, a.k.data(), a.v.data(), Slots({2, 5, 8}, c, 0, 40)).ok());
  // b's first 32 tokens are a's: only its suffix is written and prefilled.
  ASSERT_TRUE(AppendKv(kv.view, b.k.data() + 32 * kvh * d, b.v.data() + 32 * kvh * d,
                       Slots({2, 5, 11}, c, 32, 45)).ok());
  CpuAttention attn(nullptr);
  std::vector<float> ob(13 * row);
  PrefillBatch pb{{32}, {0, 13}, {0, 3}, {2, 5, 11}};
  ASSERT_TRUE(attn.Prefill(pb, kv.view, shape, b.q.data() + 32 * row, ob.data()).ok());
  EXPECT_LE(MaxDiff(ob, ReferencePrefill(pb, kv.view, shape, b.q.data() + 32 * row)), kTol);

  ChunkContext ctx;
  ctx.chunk_size = c;
  ctx.seq_ids = {1, 2};
  ctx.seq_len = {40, 45};
  ctx.shared_chunk = {2, 5};
  ctx.shared_begin = {0, 0};
  ctx.shared_end = {2, 2};
  ctx.shared_tokens = {16, 16};
  ctx.private_begin = {0, 1};
  ctx.private_end = {1, 2};
  ctx.private_chunk = {8, 11};
  ctx.private_tokens = {8, 13};
  ASSERT_TRUE(ValidateChunkContext(ctx, 16).ok());
  const absl::StatusOr<DecodePlan> plan = PlanDecode(ctx, 16);
  ASSERT_TRUE(plan.ok());
  std::vector<float> q = RandomVector(rng, 2 * row, 2.0f), o(2 * row, NAN);
  ASSERT_TRUE(attn.Decode(DecodeImpl::kTpp, *plan, ctx, kv.view, shape, q.data(), o.data()).ok());
  EXPECT_LE(MaxDiff(o, ReferenceDecode(ctx, kv.view, shape, q.data())), kTol);
}

TEST(KvTest, AppendRoundsToTheDtypeAndCopyMovesPrefixes) {
  TestPool kv(DType::kBFloat16, 4, 2, 16, 16);
  std::mt19937 rng(14);
  const std::vector<float> k = RandomVector(rng, 3 * 2 * 16, 1.0f), v = RandomVector(rng, 3 * 2 * 16, 1.0f);
  ASSERT_TRUE(AppendKv(kv.view, k.data(), v.data(), {1 * 16 + 0, 1 * 16 + 1, 1 * 16 + 15}).ok());
  for (int h = 0; h < 2; ++h) {
    for (int x = 0; x < 16; ++x) {
      EXPECT_EQ(LoadAs(kv.view.dtype, kv.view.k, ((1 * 2 + h) * 16 + 15) * 16 + x),
                BFloat16ToFloat(FloatToBFloat16(k[(2 * 2 + h) * 16 + x])));
    }
  }
  ASSERT_TRUE(CopyKv(kv.view, {KvCopy{1, 3, 2}}).ok());
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 2 * 16; ++i) {
      EXPECT_EQ(LoadAs(kv.view.dtype, kv.view.v, ((3 * 2 + h) * 16) * 16 + i),
                LoadAs(kv.view.dtype, kv.view.v, ((1 * 2 + h) * 16) * 16 + i));
    }
    // Slot 2 onward of the destination was not touched: still the NaN poison.
    EXPECT_TRUE(std::isnan(LoadAs(kv.view.dtype, kv.view.k, ((3 * 2 + h) * 16 + 2) * 16)));
  }
}

TEST(BadInputTest, RejectedWithInvalidArgument) {
  TestPool kv(DType::kFloat16, 4, 2, 16, 64);
  AttentionShape shape{4, 2, 64, 0};
  const std::vector<float> q(2 * 4 * 64, 1.0f);
  std::vector<float> o(q.size());
  CpuAttention attn(nullptr);
  ChunkContext ctx;
  ctx.chunk_size = 16;
  ctx.version = 1;
  ctx.seq_ids = {1, 2};
  ctx.seq_len = {20, 3};
  ctx.shared_chunk = {0};
  ctx.shared_begin = {0};
  ctx.shared_end = {1};
  ctx.shared_tokens = {16};
  ctx.private_begin = {0, 1};
  ctx.private_end = {1, 2};
  ctx.private_chunk = {1, 2};
  ctx.private_tokens = {4, 3};
  const absl::StatusOr<DecodePlan> plan = PlanDecode(ctx, 4);
  ASSERT_TRUE(plan.ok());
  auto decode = [&](const ChunkContext& c, const KvPoolView& view, const AttentionShape& s) {
    return attn.Decode(DecodeImpl::kTpp, *plan, c, view, s, q.data(), o.data()).code();
  };
  using absl::StatusCode;
  EXPECT_EQ(decode(ctx, kv.view, shape), StatusCode::kOk);

  ChunkContext bad = ctx;
  bad.private_chunk = {1, 4};  // outside the pool
  EXPECT_EQ(PlanDecode(bad, 4).status().code(), StatusCode::kInvalidArgument);
  bad = ctx;
  bad.shared_end = {3};
  EXPECT_EQ(PlanDecode(bad, 4).status().code(), StatusCode::kInvalidArgument);
  bad = ctx;
  bad.private_end = {1, 1};  // sequence 1 has no chunks at all
  EXPECT_EQ(PlanDecode(bad, 4).status().code(), StatusCode::kInvalidArgument);
  bad = ctx;
  bad.private_tokens = {17, 3};
  EXPECT_EQ(decode(bad, kv.view, shape), StatusCode::kInvalidArgument);
  bad = ctx;
  bad.version = 2;
  EXPECT_EQ(decode(bad, kv.view, shape), StatusCode::kFailedPrecondition);

  KvPoolView view = kv.view;
  view.k = nullptr;
  EXPECT_EQ(decode(ctx, view, shape), StatusCode::kInvalidArgument);
  view = kv.view;
  view.head_dim = 72;
  EXPECT_EQ(decode(ctx, view, AttentionShape{4, 2, 72, 0}), StatusCode::kInvalidArgument);
  EXPECT_EQ(decode(ctx, kv.view, AttentionShape{3, 2, 64, 0}), StatusCode::kInvalidArgument);
  EXPECT_EQ(decode(ctx, kv.view, AttentionShape{4, 2, 64, NAN}), StatusCode::kInvalidArgument);
  view = kv.view;
  view.chunk_size = 48;
  EXPECT_EQ(decode(ctx, view, shape), StatusCode::kInvalidArgument);

  PrefillBatch batch{{10}, {0, 7}, {0, 1}, {2}};  // 17 tokens in one 16-token chunk
  EXPECT_EQ(attn.Prefill(batch, kv.view, shape, q.data(), o.data()).code(), StatusCode::kInvalidArgument);
  batch = {{0}, {0, 0}, {0, 1}, {2}};  // no new tokens
  EXPECT_EQ(attn.Prefill(batch, kv.view, shape, q.data(), o.data()).code(), StatusCode::kInvalidArgument);
  batch = {{0}, {0, 2}, {0, 1}, {9}};
  EXPECT_EQ(attn.Prefill(batch, kv.view, shape, q.data(), o.data()).code(), StatusCode::kInvalidArgument);

  const std::vector<float> kvals(2 * 64);
  EXPECT_EQ(AppendKv(kv.view, kvals.data(), kvals.data(), {64}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AppendKv(kv.view, kvals.data(), kvals.data(), {-1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyKv(kv.view, {KvCopy{0, 4, 1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyKv(kv.view, {KvCopy{0, 1, 17}}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn::cpu
