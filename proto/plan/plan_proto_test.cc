// The plan's wire form carries every field: random plans and results survive
// C++ -> proto -> bytes -> proto -> C++ unchanged, and decoding into a used
// plan leaves nothing of the old one.
#include "proto/plan/plan_proto.h"

#include <random>

#include "gtest/gtest.h"

namespace chunkattn {
namespace {

std::vector<int32_t> Ints(std::mt19937_64& rng, int max_len, int32_t lo, int32_t hi) {
  std::vector<int32_t> v(rng() % (max_len + 1));
  for (int32_t& x : v) x = std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  return v;
}

StepPlan RandomPlan(std::mt19937_64& rng) {
  StepPlan p;
  p.step = rng();
  p.num_kv_chunks = rng() % 2 ? static_cast<int64_t>(rng() % 100000) : 0;
  for (int k = rng() % 4; k > 0; --k) {
    SamplerStart s;
    s.key = static_cast<int64_t>(rng() >> 1);
    s.params.temperature = static_cast<float>(rng() % 200) / 100;
    s.params.top_k = static_cast<int32_t>(rng() % 50);
    s.params.top_p = static_cast<float>(rng() % 100 + 1) / 100;
    s.params.min_p = static_cast<float>(rng() % 100) / 100;
    s.params.repetition_penalty = static_cast<float>(rng() % 300 + 1) / 100;
    s.params.seed = rng();
    s.params.top_logprobs = static_cast<int32_t>(rng() % (kMaxTopLogprobs + 1));
    s.history = Ints(rng, 40, 0, 32000);
    s.min_tokens = static_cast<int32_t>(rng() % 5);
    s.suppress_ids = Ints(rng, 3, 0, 32000);
    p.sampler_starts.push_back(s);
  }
  for (int k = rng() % 4; k > 0; --k) p.sampler_ends.push_back(static_cast<int64_t>(rng() >> 1));
  for (int k = rng() % 5; k > 0; --k) {
    KvMove m;
    m.kind = static_cast<KvMove::Kind>(rng() % 3);
    m.tier = static_cast<KvTier>(1 + rng() % 3);
    m.slot = static_cast<int64_t>(rng() >> 1);
    m.to_slot = static_cast<int64_t>(rng() % 100000);
    m.chunk = static_cast<int32_t>(rng() % 1000);
    m.key = rng();
    p.moves.push_back(m);
  }
  for (int k = rng() % 4; k > 0; --k) {
    p.copies.push_back({static_cast<int32_t>(rng() % 1000), static_cast<int32_t>(rng() % 1000),
                        static_cast<int32_t>(rng() % 64 + 1)});
  }
  p.tokens = Ints(rng, 60, 0, 32000);
  p.prefill.prefix_len = Ints(rng, 5, 0, 4096);
  p.prefill.q_begin = Ints(rng, 6, 0, 60);
  p.prefill.chunk_begin = Ints(rng, 6, 0, 60);
  p.prefill.chunk_ids = Ints(rng, 30, 0, 999);
  p.has_context = rng() % 2;
  if (p.has_context) {
    ChunkContext& c = p.context;
    c.version = rng();
    for (int k = rng() % 6; k > 0; --k) c.seq_ids.push_back(static_cast<int64_t>(rng() >> 1));
    c.shared_chunk = Ints(rng, 8, 0, 999);
    c.shared_begin = Ints(rng, 8, 0, 8);
    c.shared_end = Ints(rng, 8, 0, 8);
    c.shared_tokens = Ints(rng, 8, 1, 64);
    c.private_begin = Ints(rng, 8, -3, 8);  // the wire carries what it is given
    c.private_end = Ints(rng, 8, -3, 8);
    c.private_chunk = Ints(rng, 8, 0, 999);
    c.private_tokens = Ints(rng, 8, 1, 64);
  }
  p.has_decode = rng() % 2;
  p.masks_follow = rng() % 2;
  p.seq_len = Ints(rng, 8, 1, 4096);
  p.logits_rows = Ints(rng, 8, 0, 60);
  for (int k = rng() % 6; k > 0; --k) {
    p.samples.push_back({static_cast<int32_t>(rng() % 8), static_cast<int64_t>(rng() >> 1), rng(), {}});
    if (rng() % 2 == 0) {  // a constrained sample's mask: dense (bytes on the wire) or sparse (ids)
      std::vector<uint32_t>& allowed = p.samples.back().allowed;
      allowed.assign(1 + rng() % 6, 0);
      if (rng() % 2 == 0) {
        for (uint32_t& w : allowed) w = static_cast<uint32_t>(rng());
      } else {
        for (int b = rng() % 3; b >= 0; --b) allowed[rng() % allowed.size()] |= uint32_t{1} << (rng() % 32);
      }
    }
  }
  return p;
}

void ExpectSamePlan(const StepPlan& a, const StepPlan& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.num_kv_chunks, b.num_kv_chunks);
  ASSERT_EQ(a.sampler_starts.size(), b.sampler_starts.size());
  for (size_t k = 0; k < a.sampler_starts.size(); ++k) {
    const SamplerStart &x = a.sampler_starts[k], &y = b.sampler_starts[k];
    EXPECT_EQ(x.key, y.key);
    EXPECT_EQ(x.params.temperature, y.params.temperature);
    EXPECT_EQ(x.params.top_k, y.params.top_k);
    EXPECT_EQ(x.params.top_p, y.params.top_p);
    EXPECT_EQ(x.params.min_p, y.params.min_p);
    EXPECT_EQ(x.params.repetition_penalty, y.params.repetition_penalty);
    EXPECT_EQ(x.params.seed, y.params.seed);
    EXPECT_EQ(x.params.top_logprobs, y.params.top_logprobs);
    EXPECT_EQ(x.history, y.history);
    EXPECT_EQ(x.min_tokens, y.min_tokens);
    EXPECT_EQ(x.suppress_ids, y.suppress_ids);
  }
  EXPECT_EQ(a.sampler_ends, b.sampler_ends);
  EXPECT_EQ(a.moves, b.moves);
  EXPECT_EQ(a.copies, b.copies);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.prefill.prefix_len, b.prefill.prefix_len);
  EXPECT_EQ(a.prefill.q_begin, b.prefill.q_begin);
  EXPECT_EQ(a.prefill.chunk_begin, b.prefill.chunk_begin);
  EXPECT_EQ(a.prefill.chunk_ids, b.prefill.chunk_ids);
  EXPECT_EQ(a.has_context, b.has_context);
  EXPECT_EQ(a.context.version, b.context.version);
  EXPECT_EQ(a.context.seq_ids, b.context.seq_ids);
  EXPECT_EQ(a.context.shared_chunk, b.context.shared_chunk);
  EXPECT_EQ(a.context.shared_begin, b.context.shared_begin);
  EXPECT_EQ(a.context.shared_end, b.context.shared_end);
  EXPECT_EQ(a.context.shared_tokens, b.context.shared_tokens);
  EXPECT_EQ(a.context.private_begin, b.context.private_begin);
  EXPECT_EQ(a.context.private_end, b.context.private_end);
  EXPECT_EQ(a.context.private_chunk, b.context.private_chunk);
  EXPECT_EQ(a.context.private_tokens, b.context.private_tokens);
  EXPECT_EQ(a.has_decode, b.has_decode);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.logits_rows, b.logits_rows);
  EXPECT_EQ(a.masks_follow, b.masks_follow);
  ASSERT_EQ(a.samples.size(), b.samples.size());
  for (size_t k = 0; k < a.samples.size(); ++k) {
    EXPECT_EQ(a.samples[k].row, b.samples[k].row);
    EXPECT_EQ(a.samples[k].key, b.samples[k].key);
    EXPECT_EQ(a.samples[k].step, b.samples[k].step);
    EXPECT_EQ(a.samples[k].allowed, b.samples[k].allowed);
  }
}

TEST(PlanProto, RandomPlansSurviveTheWire) {
  std::mt19937_64 rng(20261124);
  StepPlan decoded = RandomPlan(rng);  // reused: decoding must overwrite it whole
  for (int i = 0; i < 500; ++i) {
    const StepPlan plan = RandomPlan(rng);
    internal::v1::StepPlan wire;
    ToProto(plan, &wire);
    internal::v1::StepPlan parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
    ASSERT_TRUE(FromProto(parsed, &decoded).ok());
    ExpectSamePlan(plan, decoded);
    if (::testing::Test::HasFailure()) break;
  }
}

// A move the C++ plan cannot hold is refused on the way in, whatever else
// the plan carries: an unknown kind or tier (proto3 keeps unknown enum
// values), a negative slot, or a store or load of a negative chunk.
TEST(PlanProto, MalformedMovesAreRefused) {
  std::mt19937_64 rng(41);
  for (int i = 0; i < 200; ++i) {
    StepPlan plan = RandomPlan(rng);
    KvMove good;
    good.kind = static_cast<KvMove::Kind>(rng() % 3);
    good.tier = rng() % 2 ? KvTier::kHost : KvTier::kDisk;
    good.slot = static_cast<int64_t>(rng() % 100);
    good.to_slot = static_cast<int64_t>(rng() % 100);
    good.chunk = static_cast<int32_t>(rng() % 100);
    plan.moves.push_back(good);
    internal::v1::StepPlan wire;
    ToProto(plan, &wire);
    StepPlan decoded;
    ASSERT_TRUE(FromProto(wire, &decoded).ok());
    internal::v1::KvMove* bad = wire.mutable_moves(wire.moves_size() - 1);
    switch (rng() % 5) {
      case 0:
        bad->set_kind(rng() % 2 ? internal::v1::KvMove::KIND_UNSPECIFIED
                                : static_cast<internal::v1::KvMove::Kind>(4 + rng() % 1000));
        break;
      case 1:
        bad->set_tier(rng() % 2 ? internal::v1::KV_TIER_UNSPECIFIED : static_cast<internal::v1::KvTier>(4 + rng() % 1000));
        break;
      case 2:
        bad->set_slot(-1 - static_cast<int64_t>(rng() % 1000));
        break;
      case 3:
        bad->set_to_slot(-1 - static_cast<int64_t>(rng() % 1000));
        break;
      default:
        bad->set_kind(rng() % 2 ? internal::v1::KvMove::KIND_STORE : internal::v1::KvMove::KIND_LOAD);
        bad->set_chunk(-1 - static_cast<int32_t>(rng() % 1000));
        break;
    }
    internal::v1::StepPlan parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
    EXPECT_EQ(FromProto(parsed, &decoded).code(), absl::StatusCode::kInvalidArgument) << parsed.DebugString();
  }
  // A demote names no pool chunk: its chunk field is not read.
  internal::v1::StepPlan wire;
  internal::v1::KvMove* demote = wire.add_moves();
  demote->set_kind(internal::v1::KvMove::KIND_DEMOTE);
  demote->set_tier(internal::v1::KV_TIER_HOST);
  demote->set_chunk(-1);
  StepPlan decoded;
  EXPECT_TRUE(FromProto(wire, &decoded).ok());
}

// The masks that follow a plan: its samples' masks, in order, and nothing
// that is not that step's masks message.
TEST(PlanProto, MasksFollowTheirPlan) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    const StepPlan plan = RandomPlan(rng);
    internal::v1::StepPlan wire;
    MasksToProto(plan, &wire);
    internal::v1::StepPlan parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
    std::vector<std::vector<uint32_t>> masks = {{1, 2, 3}};  // overwritten whole
    ASSERT_TRUE(MasksFromProto(parsed, plan.step, plan.samples.size(), &masks).ok());
    ASSERT_EQ(masks.size(), plan.samples.size());
    for (size_t k = 0; k < masks.size(); ++k) EXPECT_EQ(masks[k], plan.samples[k].allowed);
    EXPECT_EQ(MasksFromProto(parsed, plan.step + 1, plan.samples.size(), &masks).code(),
              absl::StatusCode::kInvalidArgument);  // another step's
    EXPECT_EQ(MasksFromProto(parsed, plan.step, plan.samples.size() + 1, &masks).code(),
              absl::StatusCode::kInvalidArgument);  // another plan's
    ToProto(plan, &wire);  // a plan is not a masks message
    EXPECT_EQ(MasksFromProto(wire, plan.step, plan.samples.size(), &masks).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(PlanProto, RandomResultsSurviveTheWire) {
  std::mt19937_64 rng(7);
  StepResult decoded;
  for (int i = 0; i < 200; ++i) {
    StepResult r;
    r.step = rng();
    r.tokens = Ints(rng, 20, 0, 150000);
    for (size_t k = 0; k < r.tokens.size(); ++k) r.logprobs.push_back(-static_cast<float>(rng() % 1000) / 37);
    for (size_t k = 0; k < r.tokens.size(); ++k) {
      for (int j = static_cast<int>(rng() % 4); j > 0; --j) {
        r.top_token_ids.push_back(static_cast<int32_t>(rng() % 150000));
        r.top_logprobs.push_back(-static_cast<float>(rng() % 1000) / 41);
      }
    }
    r.compute_seconds = static_cast<double>(rng() % 100000) / 1e6;
    r.failed_moves = Ints(rng, 6, 0, 1000);
    internal::v1::StepResult wire;
    ToProto(r, &wire);
    internal::v1::StepResult parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
    FromProto(parsed, &decoded);
    EXPECT_EQ(decoded.step, r.step);
    EXPECT_EQ(decoded.tokens, r.tokens);
    EXPECT_EQ(decoded.logprobs, r.logprobs);
    EXPECT_EQ(decoded.top_token_ids, r.top_token_ids);
    EXPECT_EQ(decoded.top_logprobs, r.top_logprobs);
    EXPECT_EQ(decoded.compute_seconds, r.compute_seconds);
    EXPECT_EQ(decoded.failed_moves, r.failed_moves);
  }
}

}  // namespace
}  // namespace chunkattn
