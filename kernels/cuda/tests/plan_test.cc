// The CUDA kernels' host planning, executed on the CPU: a float64 executor
// runs every work item exactly as the kernel's contract says (rows mapped by
// MapRow, keys by KeyAt and ItemEnd, partial or direct output, then the merge
// lists) and must reproduce the float64 oracle on random forests, with and
// without split-KV. Runs everywhere; the device arithmetic itself is
// cuda_attention_test's, on a GPU.
#include "kernels/cuda/plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>

#include "absl/strings/str_format.h"
#include "base/sanitizer.h"
#include "kernels/api/attention_state.h"
#include "kernels/cpu/reference.h"
#include "kernels/tests/attention_test_util.h"
#include "kernels/tests/random_forest.h"

namespace chunkattn::cuda {
namespace {

using testing::ForestOptions;
using testing::MaxDiff;
using testing::RandomForest;
using testing::RandomVector;
using testing::TestPool;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Outputs of a plan execution, and how often each output and partial state
// was written (each must be written exactly once).
struct Executed {
  std::vector<double> o;
  std::vector<int> o_writes;
  std::vector<double> part_o, part_m, part_n;
  std::vector<int> part_writes;
};

// Runs `items` over `table_chunk` / `tokens` like the kernel would.
void RunItems(const std::vector<WorkItem>& items, const std::vector<int32_t>& table_chunk,
              const std::vector<int32_t>& tokens, int group, const KvPoolView& kv, const AttentionShape& shape,
              const float* q, Executed* ex) {
  const int d = shape.head_dim, H = shape.num_heads, c = kv.chunk_size, log2c = Log2ChunkSize(c);
  const double scale = shape.EffectiveScale();
  for (const WorkItem& w : items) {
    ASSERT_GE(w.num_chunks, 1);
    ASSERT_GE(w.num_rows, 1);
    ASSERT_LE(w.num_rows, kTileRows);
    ASSERT_EQ(w.num_rows % group, 0);
    const int32_t end = ItemEnd(w, c, group, tokens.data() + w.list);
    for (int r = 0; r < w.num_rows; ++r) {
      const RowRef ref = MapRow(w, r, group, H, d);
      // State over this row's keys, in position order.
      std::vector<double> o(d, 0.0);
      double m = -INFINITY, n = 0;
      for (int32_t p = 0; p < end; ++p) {
        if (!KeyAt(p, log2c, w.num_chunks, tokens.data() + w.list) || p > ref.pos) continue;
        const int64_t chunk = table_chunk[w.list + (p >> log2c)];
        const int64_t base = ((chunk * kv.num_kv_heads + w.kv_head) * c + (p & (c - 1))) * d;
        double dot = 0;
        for (int x = 0; x < d; ++x) dot += double{q[ref.qo + x]} * LoadAs(kv.dtype, kv.k, base + x);
        std::vector<double> v(d);
        for (int x = 0; x < d; ++x) v[x] = LoadAs(kv.dtype, kv.v, base + x);
        MergeState(o.data(), &m, &n, v.data(), scale * dot, 1.0, d);
      }
      if (ref.partial < 0) {
        for (int x = 0; x < d; ++x) ex->o[ref.qo + x] = o[x] / n;
        ++ex->o_writes[ref.qo / d];
      } else {
        ASSERT_LT(ref.partial, static_cast<int64_t>(ex->part_m.size()));
        std::copy(o.begin(), o.end(), ex->part_o.begin() + ref.partial * d);
        ex->part_m[ref.partial] = m;
        ex->part_n[ref.partial] = n;
        ++ex->part_writes[ref.partial];
      }
    }
  }
}

Executed ExecuteDecode(const DecodeWork& work, const std::vector<int32_t>& tokens, const KvPoolView& kv,
                       const AttentionShape& shape, const float* q) {
  const int d = shape.head_dim, H = shape.num_heads;
  Executed ex;
  ex.o.assign(int64_t{work.num_seqs} * H * d, kNaN);
  ex.o_writes.assign(int64_t{work.num_seqs} * H, 0);
  ex.part_o.assign(work.num_slots * H * d, kNaN);
  ex.part_m.assign(work.num_slots * H, kNaN);
  ex.part_n.assign(work.num_slots * H, kNaN);
  ex.part_writes.assign(work.num_slots * H, 0);
  RunItems(work.items, work.table_chunk, tokens, work.group, kv, shape, q, &ex);
  for (size_t i = 0; i < work.merge_seq.size(); ++i) {
    const int s = work.merge_seq[i];
    for (int h = 0; h < H; ++h) {
      std::vector<double> o(d, 0.0);
      double m = -INFINITY, n = 0;
      for (int32_t k = work.merge_begin[i]; k < work.merge_begin[i + 1]; ++k) {
        const int64_t idx = int64_t{work.merge_slot[k]} * H + h;
        EXPECT_EQ(ex.part_writes[idx], 1) << "slot " << work.merge_slot[k] << " head " << h;
        MergeState(o.data(), &m, &n, ex.part_o.data() + idx * d, ex.part_m[idx], ex.part_n[idx], d);
      }
      for (int x = 0; x < d; ++x) ex.o[(int64_t{s} * H + h) * d + x] = o[x] / n;
      ++ex.o_writes[int64_t{s} * H + h];
    }
  }
  return ex;
}

// (impl, group, chunk_size, concurrent_items)
using Params = std::tuple<DecodeImpl, int, int, int>;

class DecodeWorkParity : public ::testing::TestWithParam<Params> {};

TEST_P(DecodeWorkParity, ExecutedPlanMatchesTheOracle) {
  const auto [impl, g, c, concurrent] = GetParam();
  const int kvh = 2, d = 16;
  const AttentionShape shape{kvh * g, kvh, d, 0};
  PlanOptions opt;
  opt.concurrent_items = concurrent;
  opt.min_piece_tokens = c;  // let small test forests split too
  ForestOptions fopt;
  fopt.max_seqs = 40;  // more than one chunk-first tile at g = 1 (64 rows), also at g = 8 (8 sequences)
  fopt.max_run = 5;
  fopt.max_private = 6;
  std::mt19937 rng(g * 100 + c + concurrent);
  int split_seen = 0;
  for (int trial = 0; trial < SanitizerSlice(12, 2); ++trial) {  // the float64 oracle dominates
    SCOPED_TRACE(absl::StrFormat("trial %d", trial));
    TestPool kv(DType::kFloat32, testing::MaxForestChunks(fopt), kvh, c, d);
    const ChunkContext ctx = RandomForest(rng, kv, fopt);
    const std::vector<float> q = RandomVector(rng, int64_t{ctx.num_seqs()} * shape.num_heads * d, 1.5f);
    absl::StatusOr<DecodeWork> work = PlanDecodeWork(impl, ctx, kv.view.num_chunks, shape, opt);
    ASSERT_TRUE(work.ok()) << work.status();
    std::vector<int32_t> tokens;
    ASSERT_TRUE(FillTokens(*work, ctx, &tokens).ok());
    const Executed ex = ExecuteDecode(*work, tokens, kv.view, shape, q.data());
    for (size_t i = 0; i < ex.o_writes.size(); ++i) ASSERT_EQ(ex.o_writes[i], 1) << "output row " << i;
    for (int w : ex.part_writes) ASSERT_EQ(w, 1);  // no slot allocated and left unused
    const std::vector<double> want = cpu::ReferenceDecode(ctx, kv.view, shape, q.data());
    std::vector<float> got(ex.o.begin(), ex.o.end());
    EXPECT_LT(MaxDiff(got, want), 1e-6);

    // Heaviest first, and the split never cuts below the minimum piece.
    for (size_t i = 1; i < work->items.size(); ++i) {
      ASSERT_GE(work->items[i - 1].num_chunks, work->items[i].num_chunks);
    }
    PlanOptions unsplit = opt;
    unsplit.concurrent_items = 0;
    const size_t lists_unsplit = PlanDecodeWork(impl, ctx, kv.view.num_chunks, shape, unsplit)->items.size();
    if (work->items.size() > lists_unsplit) ++split_seen;
    if (concurrent == 0) {
      EXPECT_EQ(work->items.size(), lists_unsplit);
    }
  }
  if (concurrent >= 64) {
    EXPECT_GT(split_seen, 0) << "no trial exercised split-KV";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Plans, DecodeWorkParity,
    ::testing::Combine(::testing::Values(DecodeImpl::kTpp, DecodeImpl::kSequence), ::testing::Values(1, 4, 8),
                       ::testing::Values(16, 64), ::testing::Values(0, 64)),
    [](const ::testing::TestParamInfo<Params>& info) {
      return absl::StrFormat("%s_g%d_c%d_conc%d", DecodeImplName(std::get<0>(info.param)),
                             std::get<1>(info.param), std::get<2>(info.param), std::get<3>(info.param));
    });

// The paper's (n_s, n_p) = (4096, 4096) at b = 32, h = 32, c = 64 plus one
// decoded token each: one run of 64 shared chunks, one private chunk per
// sequence.
ChunkContext PaperContext(int batch, int shared_chunks) {
  ChunkContext ctx;
  ctx.chunk_size = 64;
  ctx.version = 7;
  for (int k = 0; k < shared_chunks; ++k) {
    ctx.shared_chunk.push_back(k);
    ctx.shared_begin.push_back(0);
    ctx.shared_end.push_back(batch);
    ctx.shared_tokens.push_back(64);
  }
  for (int s = 0; s < batch; ++s) {
    ctx.seq_ids.push_back(s);
    ctx.seq_len.push_back(shared_chunks * 64 + 1);
    ctx.private_begin.push_back(s);
    ctx.private_end.push_back(s + 1);
    ctx.private_chunk.push_back(shared_chunks + s);
    ctx.private_tokens.push_back(1);
  }
  return ctx;
}

TEST(DecodeWorkShape, PaperWorkloadSplitsTheSharedRunAcrossTheGpu) {
  const ChunkContext ctx = PaperContext(32, 64);
  ASSERT_TRUE(ValidateChunkContext(ctx, 96).ok());
  const AttentionShape mha{32, 32, 128, 0};
  PlanOptions opt;
  opt.concurrent_items = 132 * 2;  // H100: 132 SMs, 2 blocks each at d = 128
  absl::StatusOr<DecodeWork> tpp = PlanDecodeWork(DecodeImpl::kTpp, ctx, 96, mha, opt);
  ASSERT_TRUE(tpp.ok()) << tpp.status();
  int chunk_first = 0, seq_first = 0, max_chunks = 0;
  for (const WorkItem& w : tpp->items) {
    if (w.num_rows == 32) {
      ++chunk_first;
      max_chunks = std::max(max_chunks, w.num_chunks);
    } else {
      EXPECT_EQ(w.num_rows, 1);
      EXPECT_EQ(w.num_chunks, 1);
      ++seq_first;
    }
  }
  EXPECT_EQ(seq_first, 32 * 32);  // (sequence, head) over its one private chunk
  // 32 heads x 64 chunks cut into pieces of >= 4 chunks (256 tokens).
  EXPECT_GT(chunk_first, 32);
  EXPECT_EQ(chunk_first % 32, 0);
  EXPECT_GE(max_chunks, 4);
  EXPECT_LE(max_chunks, 16);
  EXPECT_EQ(tpp->merge_seq.size(), 32u);
  EXPECT_EQ(tpp->max_merge, chunk_first / 32 + 1);

  // The baseline: one list per (sequence, head) over 65 chunks, enough items
  // (1024) that nothing is cut, so every sequence writes its output directly.
  absl::StatusOr<DecodeWork> seq = PlanDecodeWork(DecodeImpl::kSequence, ctx, 96, mha, opt);
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(seq->items.size(), 32u * 32);
  EXPECT_TRUE(seq->merge_seq.empty());
  EXPECT_EQ(seq->num_slots, 0);

  // GQA 32/8: a chunk-first item holds 32 sequences x 4 heads = 128 rows, two tiles.
  const AttentionShape gqa{32, 8, 128, 0};
  absl::StatusOr<DecodeWork> g = PlanDecodeWork(DecodeImpl::kTpp, ctx, 96, gqa, opt);
  ASSERT_TRUE(g.ok());
  for (const WorkItem& w : g->items) EXPECT_TRUE(w.num_rows == 64 || w.num_rows == 4) << w.num_rows;
}

// The deepest sharing a forest of n sequences can have: sequences [k, n)
// share chunk k (k = 0..n-2), so sequence s reads min(s, n - 2) + 1 runs of
// its own range; then one private chunk each.
ChunkContext NestedContext(int n, int c) {
  ChunkContext ctx;
  ctx.chunk_size = c;
  ctx.version = 3;
  for (int k = 0; k + 1 < n; ++k) {
    ctx.shared_chunk.push_back(k);
    ctx.shared_begin.push_back(k);
    ctx.shared_end.push_back(n);
    ctx.shared_tokens.push_back(c);
  }
  for (int s = 0; s < n; ++s) {
    ctx.seq_ids.push_back(s);
    ctx.seq_len.push_back((std::min(s, n - 2) + 1) * c + 1);
    ctx.private_begin.push_back(s);
    ctx.private_end.push_back(s + 1);
    ctx.private_chunk.push_back(n + s);
    ctx.private_tokens.push_back(1);
  }
  return ctx;
}

int LongestPath(const ChunkContext& ctx) {
  size_t longest = 0;
  for (int s = 0; s < ctx.num_seqs(); ++s) longest = std::max(longest, SequenceChunks(ctx, s).size());
  return static_cast<int>(longest);
}

// Every plan fits the buffers BoundDecodeWork sizes for its sequence count
// and longest path (so a reservation made from them never grows), on random
// forests, the deepest nesting and the paper's shape, split and unsplit.
TEST(DecodeWorkBounds, EveryPlanFitsItsBounds) {
  const int c = 16, d = 16;
  std::mt19937 rng(17);
  std::vector<ChunkContext> contexts;
  std::vector<std::unique_ptr<TestPool>> pools;
  for (int trial = 0; trial < 40; ++trial) {
    ForestOptions fopt;
    fopt.max_seqs = 1 + trial * 3;
    fopt.max_run = 1 + trial % 6;
    fopt.max_private = 1 + trial % 5;
    pools.push_back(std::make_unique<TestPool>(DType::kFloat32, testing::MaxForestChunks(fopt), 1, c, d));
    contexts.push_back(RandomForest(rng, *pools.back(), fopt));
  }
  for (int n : {2, 3, 17, 65, 130}) contexts.push_back(NestedContext(n, c));
  contexts.push_back(PaperContext(32, 64));  // chunk 64

  for (const ChunkContext& ctx : contexts) {
    const int64_t pool_chunks = 1 << 16;
    const absl::Status valid = ValidateChunkContext(ctx, pool_chunks);
    ASSERT_TRUE(valid.ok()) << valid << " (" << ctx.num_seqs() << " seqs)";
    for (DecodeImpl impl : {DecodeImpl::kTpp, DecodeImpl::kSequence}) {
      for (int g : {1, 4, 8}) {
        for (int concurrent : {0, 8, 264}) {
          SCOPED_TRACE(absl::StrFormat("%s g%d conc%d, %d seqs, longest path %d", DecodeImplName(impl), g,
                                       concurrent, ctx.num_seqs(), LongestPath(ctx)));
          const AttentionShape shape{4 * g, 4, d, 0};
          PlanOptions opt;
          opt.concurrent_items = concurrent;
          opt.min_piece_tokens = c;  // split as finely as allowed
          absl::StatusOr<DecodeWork> work = PlanDecodeWork(impl, ctx, pool_chunks, shape, opt);
          ASSERT_TRUE(work.ok()) << work.status();
          const DecodeWorkBounds b = BoundDecodeWork(impl, ctx.num_seqs(), LongestPath(ctx), shape, opt);
          EXPECT_LE(static_cast<int64_t>(work->items.size()), b.items);
          EXPECT_LE(static_cast<int64_t>(work->table_chunk.size()), b.table);
          EXPECT_LE(work->num_slots, b.slots);
          EXPECT_LE(static_cast<int64_t>(work->merge_seq.size()), b.merge_seqs);
          EXPECT_LE(static_cast<int64_t>(work->merge_slot.size()), b.merge_slots);
        }
      }
    }
  }

  // The nested forest comes within a factor of two of the slot bound: the
  // bound's quadratic term is needed.
  const ChunkContext nested = NestedContext(130, c);
  absl::StatusOr<DecodeWork> work = PlanDecodeWork(DecodeImpl::kTpp, nested, 1 << 16, {4, 4, d, 0}, {});
  ASSERT_TRUE(work.ok());
  EXPECT_GE(2 * work->num_slots, BoundDecodeWork(DecodeImpl::kTpp, 130, 130, {4, 4, d, 0}, {}).slots);
}

// The plan's chunk table holds the private ranges, not the gaps a context's
// private table leaves between them.
TEST(DecodeWorkShape, TableSkipsPrivateGaps) {
  ChunkContext ctx = PaperContext(4, 2);
  std::vector<int32_t> chunk(40, -1), tokens(40, 0);
  for (int s = 0; s < 4; ++s) {
    const int32_t at = 10 * s + 3;
    chunk[at] = ctx.private_chunk[s];
    tokens[at] = ctx.private_tokens[s];
    ctx.private_begin[s] = at;
    ctx.private_end[s] = at + 1;
  }
  ctx.private_chunk = chunk;
  ctx.private_tokens = tokens;
  ASSERT_TRUE(ValidateChunkContext(ctx, 8).ok());
  for (DecodeImpl impl : {DecodeImpl::kTpp, DecodeImpl::kSequence}) {
    absl::StatusOr<DecodeWork> work = PlanDecodeWork(impl, ctx, 8, {4, 4, 64, 0}, {});
    ASSERT_TRUE(work.ok());
    EXPECT_EQ(work->table_chunk.size(), impl == DecodeImpl::kTpp ? 2u + 4u : 4u * 3u);
    for (int32_t id : work->table_chunk) EXPECT_GE(id, 0);
  }
}

TEST(DecodeWorkShape, RejectsBadShapesAndContexts) {
  const ChunkContext ctx = PaperContext(4, 2);
  PlanOptions opt;
  EXPECT_EQ(PlanDecodeWork(DecodeImpl::kTpp, ctx, 8, {128, 1, 64, 0}, opt).status().code(),
            absl::StatusCode::kInvalidArgument);  // group 128 > 64 rows
  EXPECT_EQ(PlanDecodeWork(DecodeImpl::kTpp, ctx, 8, {6, 4, 64, 0}, opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanDecodeWork(DecodeImpl::kTpp, ctx, 5, {4, 4, 64, 0}, opt).status().code(),
            absl::StatusCode::kInvalidArgument);  // chunk 5 outside a 5-chunk pool
  ChunkContext bad = ctx;
  bad.chunk_size = 48;
  EXPECT_EQ(PlanDecodeWork(DecodeImpl::kTpp, bad, 8, {4, 4, 64, 0}, opt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DecodeWorkTokens, StepsWithinAVersionOnlyRefreshTokenCounts) {
  const int d = 16, c = 16;
  const AttentionShape shape{4, 2, d, 0};
  std::mt19937 rng(5);
  ForestOptions fopt;
  fopt.max_seqs = 6;
  TestPool kv(DType::kFloat32, testing::MaxForestChunks(fopt), 2, c, d);
  ChunkContext ctx = RandomForest(rng, kv, fopt);
  for (DecodeImpl impl : {DecodeImpl::kTpp, DecodeImpl::kSequence}) {
    absl::StatusOr<DecodeWork> work = PlanDecodeWork(impl, ctx, kv.view.num_chunks, shape, {});
    ASSERT_TRUE(work.ok());
    // A token appended to every sequence with room in a private tail chunk:
    // same version, so the same work with new counts must stay exact.
    ChunkContext next = ctx;
    for (int s = 0; s < next.num_seqs(); ++s) {
      const int32_t e = next.private_end[s] - 1;
      if (e < next.private_begin[s] || next.private_tokens[e] == c) continue;
      const int32_t t = next.private_tokens[e]++;
      ++next.seq_len[s];
      const int64_t head = int64_t{c} * d;
      for (int h = 0; h < 2; ++h) {
        for (int x = 0; x < d; ++x) {
          const int64_t i = (int64_t{next.private_chunk[e]} * 2 + h) * head + int64_t{t} * d + x;
          kv.original_k[i] = static_cast<float>(x % 3) - 1.0f;
          kv.original_v[i] = static_cast<float>(x);
          kv.Store(i);
        }
      }
    }
    std::vector<int32_t> tokens;
    ASSERT_TRUE(FillTokens(*work, next, &tokens).ok());
    const std::vector<float> q = RandomVector(rng, int64_t{next.num_seqs()} * shape.num_heads * d, 1.0f);
    const Executed ex = ExecuteDecode(*work, tokens, kv.view, shape, q.data());
    std::vector<float> got(ex.o.begin(), ex.o.end());
    EXPECT_LT(MaxDiff(got, cpu::ReferenceDecode(next, kv.view, shape, q.data())), 1e-6);

    ChunkContext other = next;
    ++other.version;
    EXPECT_EQ(FillTokens(*work, other, &tokens).code(), absl::StatusCode::kFailedPrecondition);
    ChunkContext overfull = next;
    overfull.shared_tokens.empty() ? overfull.private_tokens[overfull.private_begin[0]] = c + 1
                                   : overfull.shared_tokens[0] = 0;
    EXPECT_EQ(FillTokens(*work, overfull, &tokens).code(), absl::StatusCode::kInvalidArgument);
  }
}

class PrefillWorkParity : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(PrefillWorkParity, ExecutedPlanMatchesTheOracle) {
  const auto [g, c] = GetParam();
  const int kvh = 2, d = 16;
  const AttentionShape shape{kvh * g, kvh, d, 0};
  std::mt19937 rng(g * 31 + c);
  for (int trial = 0; trial < 6; ++trial) {
    TestPool kv(DType::kFloat32, 4 * 6, kvh, c, d);
    const testing::PrefillCase pc = testing::RandomPrefill(rng, kv, shape.num_heads, 4);
    absl::StatusOr<PrefillWork> work = PlanPrefillWork(pc.batch, c, kv.view.num_chunks, shape);
    ASSERT_TRUE(work.ok()) << work.status();
    Executed ex;
    ex.o.assign(int64_t{pc.batch.num_tokens()} * shape.num_heads * d, kNaN);
    ex.o_writes.assign(int64_t{pc.batch.num_tokens()} * shape.num_heads, 0);
    RunItems(work->items, work->table_chunk, work->table_tokens, g, kv.view, shape, pc.q.data(), &ex);
    for (size_t i = 0; i < ex.o_writes.size(); ++i) ASSERT_EQ(ex.o_writes[i], 1) << "row " << i;
    std::vector<float> got(ex.o.begin(), ex.o.end());
    EXPECT_LT(MaxDiff(got, cpu::ReferencePrefill(pc.batch, kv.view, shape, pc.q.data())), 1e-6);
    for (const WorkItem& w : work->items) {
      // No item reads a chunk past its last row's position.
      EXPECT_EQ(w.num_chunks, (w.pos0 + w.num_rows / g - 1) / c + 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, PrefillWorkParity,
                         ::testing::Combine(::testing::Values(1, 3, 8), ::testing::Values(16, 32)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return absl::StrFormat("g%d_c%d", std::get<0>(info.param), std::get<1>(info.param));
                         });

TEST(PrefillWorkShape, RejectsBadBatches) {
  PrefillBatch b;
  b.prefix_len = {0};
  b.q_begin = {0, 10};
  b.chunk_begin = {0, 1};
  b.chunk_ids = {3};
  EXPECT_TRUE(PlanPrefillWork(b, 16, 4, {2, 2, 64, 0}).ok());
  EXPECT_EQ(PlanPrefillWork(b, 16, 3, {2, 2, 64, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanPrefillWork(b, 8, 4, {2, 2, 64, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanPrefillWork(b, 16, 4, {130, 2, 64, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  b.q_begin = {0, 20};  // 20 tokens in one 16-token chunk
  EXPECT_EQ(PlanPrefillWork(b, 16, 4, {2, 2, 64, 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn::cuda
