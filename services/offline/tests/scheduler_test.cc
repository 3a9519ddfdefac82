// The scheduler against the real model: a seeded random workload (shared
// system prompts, staggered arrivals, n > 1, chunked prefill, a pool small
// enough to preempt) must give every request the tokens it gets when it runs
// alone, and leave no chunk in use. Plus SubsetContext against the full
// context it filters.
#include "services/core/scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/tests/redis_server.h"
#include "services/core/shared_kv_probe.h"
#include "gtest/gtest.h"
#include "services/tests/plan_limits.h"
#include "workers/model/llama.h"
#include "workers/model/weights.h"
#include "workers/server/plan_executor.h"
#include "workers/server/shared_kv_store.h"
#include "workers/tests/device_sampling_model.h"
#include "base/tests/temp_dir.h"
#include "workers/tests/tiny_model.h"

namespace chunkattn {
namespace {

using testing::TinyConfig;

// A scheduler wired to an in-process model: the coordinator's loop without
// the network.
class Harness {
 public:
  // `defer_masks`: constrained samples' masks follow their plan, as the
  // served engine sends them (the executor reads them after the forward pass).
  // `mask_pool`: computes a step's masks in parallel (the engine's pool).
  // `tiers`: the worker's KV tiers below the pool (none by default).
  Harness(int32_t num_chunks, int32_t budget, bool sharing, bool device_sampling = false, bool defer_masks = false,
          ThreadPool* mask_pool = nullptr, const KvTierOptions& tiers = KvTierOptions(), bool write_through = false) {
    config_ = TinyConfig();
    auto weights = DummyWeights(config_, {0, 1}, 7);
    EXPECT_TRUE(weights.ok()) << weights.status();
    ModelOptions mo;
    mo.chunk_size = 16;
    mo.num_kv_chunks = num_chunks;
    chunk_bytes_ = KvShapeOf(config_, weights->layout, mo).BytesPerChunk();
    if (tiers.host_bytes > 0 || !tiers.disk_dir.empty()) {
      auto store = KvTierStore::Create(tiers, chunk_bytes_);
      EXPECT_TRUE(store.ok()) << store.status();
      tier_store_ = std::move(*store);
    }
    shared_prefix_ = SharedKvKeyPrefix(config_, *weights, mo, "cpu", 0, 1);
    auto model = LlamaModel::Create(config_, std::move(*weights), mo, nullptr, nullptr);
    EXPECT_TRUE(model.ok()) << model.status();
    if (device_sampling) {
      auto wrapped = std::make_unique<testing::DeviceSamplingModel>(std::move(*model));
      device_model_ = wrapped.get();
      model_ = std::move(wrapped);
    } else {
      model_ = std::move(*model);
    }
    executor_ = std::make_unique<PlanExecutor>(model_.get(), true, tier_store_.get());
    SchedulerOptions& so = so_;
    if (tier_store_ != nullptr) {
      so.tiers.host_slots = tier_store_->slots(KvTier::kHost);
      so.tiers.disk_slots = tier_store_->slots(KvTier::kDisk);
      so.tier_write_through = write_through;
    }
    so.chunk_size = 16;
    so.num_chunks = num_chunks;
    so.max_context = config_.max_context;
    so.max_batch_size = 8;
    so.max_tokens_per_step = budget;
    so.prefix_sharing = sharing;
    so.eos_token_ids = config_.eos_token_ids;
    so.defer_masks = defer_masks;
    so.mask_pool = mask_pool;
    RecreateScheduler();
  }

  // The per-tenant retention bound (SchedulerOptions::max_retained_chunks_per_tenant).
  void SetRetainedBound(int32_t chunks) {
    so_.max_retained_chunks_per_tenant = chunks;
    RecreateScheduler();
  }

  // The bound on a step's tier loads (SchedulerOptions::max_tier_loads_per_step).
  void SetMaxTierLoadsPerStep(int32_t loads) {
    so_.max_tier_loads_per_step = loads;
    RecreateScheduler();
  }

  // A shared tier in Redis at `url` (write-through), and a probe of it for
  // each request added: a replica of its own over that store.
  void UseSharedTier(const RedisUrl& url) {
    SharedKvOptions o;
    o.url = url;
    shared_store_ = std::make_unique<SharedKvStore>(o, shared_prefix_, chunk_bytes_);
    executor_ = std::make_unique<PlanExecutor>(model_.get(), true, tier_store_.get(), shared_store_.get());
    so_.tiers.shared = true;
    so_.tier_write_through = true;
    RecreateScheduler();
    SharedKvProbeOptions po;
    po.url = url;
    po.chunk_size = so_.chunk_size;
    po.max_wait = absl::Seconds(10);
    po.redis.io_timeout = absl::Seconds(2);
    probe_ = std::make_unique<SharedKvProbe>(po, [this](int64_t id, std::vector<uint64_t> keys) {
      absl::MutexLock lock(&probe_mu_);
      answers_.emplace_back(id, std::move(keys));
    });
    probe_->SetKeyPrefixes({shared_prefix_});
  }

  // Runs until idle, adding arrivals[k] at step k. Returns tokens per
  // (request, sample).
  std::map<std::pair<RequestId, int>, std::vector<TokenId>> Run(
      std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> arrivals) {
    std::map<std::pair<RequestId, int>, std::vector<TokenId>> out;
    for (int step = 0; step < 10000; ++step) {
      for (auto& [id, spec] : arrivals[step]) {
        EXPECT_TRUE(scheduler_->Add(id, spec).ok());
        if (probe_ != nullptr) {
          scheduler_->AwaitSharedProbe(id, absl::Seconds(10));
          probe_->Probe(id, spec.prompt, spec.cache_namespace);
          ++probes_pending_;
        }
      }
      arrivals.erase(step);
      if (probe_ != nullptr) {  // the answers the engine would post to its loop
        std::vector<std::pair<int64_t, std::vector<uint64_t>>> answers;
        {
          absl::MutexLock lock(&probe_mu_);
          answers.swap(answers_);
        }
        for (const auto& [id, keys] : answers) scheduler_->SharedProbeDone(id, keys);
        probes_pending_ -= static_cast<int>(answers.size());
      }
      if (!scheduler_->HasWork() && arrivals.empty()) break;
      if (hand_over_at_ >= 0 && step >= hand_over_at_) {  // as when a worker drains
        scheduler_->set_admitting(false);
        if (scheduler_->num_started() == 0 && arrivals.empty()) break;
      }
      StepPlan plan;
      auto scheduled = scheduler_->Schedule(&plan);
      EXPECT_TRUE(scheduled.ok()) << scheduled.status();
      if (!scheduled.ok()) break;
      if (!*scheduled) {
        if (probes_pending_ > 0) absl::SleepFor(absl::Milliseconds(1));  // requests wait for their probes
        continue;
      }
      testing::ExpectPlanWithinLimits(plan, scheduler_->options());
      if (plan.has_context) ++contexts_sent_;
      if (on_plan_) on_plan_(plan);
      StepResult result;
      absl::Status s;
      if (plan.masks_follow) {
        for (const SampleRow& row : plan.samples) EXPECT_TRUE(row.allowed.empty());  // not in the plan
        StepPlan with_masks = plan;
        scheduler_->FillMasks(&with_masks);
        ++deferred_steps_;
        s = executor_->Execute(plan, &result, [&](std::vector<std::vector<uint32_t>>* masks) {
          masks->clear();
          for (const SampleRow& row : with_masks.samples) masks->push_back(row.allowed);
          return absl::OkStatus();
        });
      } else {
        s = executor_->Execute(plan, &result);
      }
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) break;
      std::vector<SampleEvent> events;
      s = scheduler_->Complete(result, &events);
      EXPECT_TRUE(s.ok()) << s;
      for (const SampleEvent& e : events) {
        out[{e.request, e.index}].push_back(e.token);
        cached_[e.request] = e.cached_prompt_tokens;
        if (e.finish != FinishReason::kNone) finish_[{e.request, e.index}] = e.finish;
      }
      EXPECT_TRUE(scheduler_->forest().CheckInvariants().ok());
      ++steps_;
    }
    return out;
  }

  Scheduler& scheduler() { return *scheduler_; }
  std::function<void(const StepPlan&)> on_plan_;  // sees each plan before it runs
  int hand_over_at_ = -1;  // from this step admit nothing new; stop once nothing has started
  std::map<RequestId, int32_t> cached_;
  std::map<std::pair<RequestId, int>, FinishReason> finish_;
  int steps_ = 0;
  int deferred_steps_ = 0;  // steps whose masks followed the plan
  int contexts_sent_ = 0;
  testing::DeviceSamplingModel* device_model_ = nullptr;
  int64_t chunk_bytes_ = 0;
  std::unique_ptr<KvTierStore> tier_store_;
  std::unique_ptr<SharedKvStore> shared_store_;

 private:
  // A new scheduler on so_ (its options are fixed at creation).
  void RecreateScheduler() {
    auto scheduler = Scheduler::Create(so_);
    EXPECT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = std::move(*scheduler);
  }

  SchedulerOptions so_;
  std::string shared_prefix_;
  std::unique_ptr<SharedKvProbe> probe_;
  absl::Mutex probe_mu_;
  std::vector<std::pair<int64_t, std::vector<uint64_t>>> answers_ ABSL_GUARDED_BY(probe_mu_);
  int probes_pending_ = 0;
  ModelConfig config_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PlanExecutor> executor_;
  std::unique_ptr<Scheduler> scheduler_;
};

struct Workload {
  std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> arrivals;
  std::vector<std::pair<RequestId, RequestSpec>> all;
};

// Greedy requests, or with `sampled` each request's own mix of temperature,
// top-k, top-p, min-p and repetition penalty, seeded.
Workload MakeWorkload(uint64_t seed, int requests, int max_new, bool sampled = false) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, 95);  // never EOS in prompts
  std::vector<std::vector<TokenId>> systems(3);
  for (auto& s : systems) {
    s.resize(std::uniform_int_distribution<int>(20, 70)(rng));
    for (auto& t : s) t = tok(rng);
  }
  Workload w;
  for (int r = 0; r < requests; ++r) {
    RequestSpec spec;
    spec.prompt = systems[rng() % systems.size()];
    const int suffix = std::uniform_int_distribution<int>(1, 25)(rng);
    for (int k = 0; k < suffix; ++k) spec.prompt.push_back(tok(rng));
    spec.sampling.temperature = 0;
    if (sampled) {
      spec.sampling.temperature = std::vector<float>{0.0f, 0.6f, 1.0f, 1.3f}[rng() % 4];
      spec.sampling.top_k = std::vector<int>{0, 5, 40}[rng() % 3];
      spec.sampling.top_p = std::vector<float>{1.0f, 0.9f, 0.5f}[rng() % 3];
      spec.sampling.min_p = std::vector<float>{0.0f, 0.05f}[rng() % 2];
      spec.sampling.repetition_penalty = std::vector<float>{1.0f, 1.2f, 0.9f}[rng() % 3];
      spec.sampling.seed = rng();
    }
    spec.max_new_tokens = std::uniform_int_distribution<int>(1, max_new)(rng);
    spec.n = (r % 4 == 3) ? 2 : 1;
    spec.ignore_eos = r % 2 == 0;
    const int at = std::uniform_int_distribution<int>(0, 12)(rng);
    w.arrivals[at].emplace_back(r + 1, spec);
    w.all.emplace_back(r + 1, spec);
  }
  return w;
}

void ExpectSameAsAlone(int32_t chunks, int32_t budget, bool sharing, uint64_t seed, bool expect_preemption,
                       int max_new = 24, bool device_sampling = false, bool sampled = false) {
  Workload w = MakeWorkload(seed, 14, max_new, sampled);
  Harness h(chunks, budget, sharing, device_sampling);
  auto together = h.Run(w.arrivals);
  for (const auto& [id, spec] : w.all) {
    Harness alone(256, 2048, false);
    auto ref = alone.Run({{0, {{id, spec}}}});
    for (int i = 0; i < spec.n; ++i) {
      const std::pair<RequestId, int> key(id, i);
      EXPECT_EQ(together[key], ref[key]) << "request " << id << " sample " << i;
      EXPECT_FALSE(ref[key].empty());
    }
  }
  const CacheStats cs = h.scheduler().cache_stats();
  EXPECT_EQ(cs.used_chunks, 0);
  EXPECT_EQ(cs.used_chunks + cs.cached_chunks + cs.free_chunks, chunks);
  EXPECT_FALSE(h.scheduler().HasWork());
  if (sharing) {
    EXPECT_GT(cs.total_matched_tokens, 0);
  }
  if (expect_preemption) {
    EXPECT_GT(h.scheduler().stats().preemptions_total, 0);
  }
  // The context goes out only when it changed, not every step.
  EXPECT_LT(h.contexts_sent_, h.steps_);
}

TEST(SchedulerTest, SharedPrefixesMatchAloneRuns) { ExpectSameAsAlone(256, 2048, true, 1, false); }

TEST(SchedulerTest, ChunkedPrefillMatchesAloneRuns) { ExpectSameAsAlone(256, 24, true, 2, false); }

TEST(SchedulerTest, PreemptionUnderMemoryPressureMatchesAloneRuns) {
  ExpectSameAsAlone(24, 64, true, 3, true, 80);
}

TEST(SchedulerTest, NoSharingBaselineMatchesAloneRuns) { ExpectSameAsAlone(256, 2048, false, 4, false); }

// Twelve system prompts of four chunks each, in waves of requests whose
// prefixes evict the last waves' from a pool of 28 chunks; host and disk
// tiers under it keep what the pool evicts. Every output equals the run
// without tiers (greedy and seeded sampling, n = 2), prompt tokens are
// loaded instead of recomputed, and with the disk tier's file overwritten
// mid-run the failed loads are recomputed: the same outputs again. With a
// bound on a step's loads, no plan carries more and the outputs are the same.
TEST(SchedulerTest, KvTiersLoadWhatThePoolEvictedWithTheSameOutputs) {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> tok(0, 95);
  std::vector<std::vector<TokenId>> systems(12, std::vector<TokenId>(64));
  for (auto& s : systems) {
    for (auto& t : s) t = tok(rng);
  }
  std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> arrivals;
  for (int r = 0; r < 48; ++r) {
    RequestSpec spec;
    spec.prompt = systems[(r * 5) % 12];
    for (int k = 3 + r % 9; k > 0; --k) spec.prompt.push_back(tok(rng));
    spec.max_new_tokens = 3 + r % 4;
    spec.ignore_eos = true;
    spec.n = r % 7 == 3 ? 2 : 1;
    if (r % 2 == 1) {
      spec.sampling.temperature = 0.8f;
      spec.sampling.seed = 100 + r;
    }
    arrivals[8 * (r / 4)].emplace_back(r + 1, spec);
  }
  const std::string dir = testing::MakeTempDir("chunkattn-tiers");
  ASSERT_FALSE(dir.empty());
  Harness plain(28, 2048, true);
  const auto want = plain.Run(arrivals);
  int64_t plain_cached = 0;
  for (const auto& [id, n] : plain.cached_) plain_cached += n;

  // `max_loads`: the bound on a step's loads (0: none); a prompt's blocks
  // then come back over several steps, and no plan carries more.
  auto tiered_run = [&](bool corrupt, bool write_through, int32_t max_loads = 0) -> int64_t {
    SCOPED_TRACE(absl::StrFormat("corrupt %d, write-through %d, at most %d loads a step", corrupt, write_through,
                                 max_loads));
    KvTierOptions tiers;
    const int64_t slot = KvTierStore::kHeaderBytes + Harness(8, 64, true).chunk_bytes_;
    tiers.host_bytes = 10 * slot;
    tiers.disk_dir = dir;
    tiers.disk_bytes = 40 * slot;
    Harness h(28, 2048, true, false, false, nullptr, tiers, write_through);
    if (max_loads > 0) h.SetMaxTierLoadsPerStep(max_loads);
    int most_loads = 0;
    h.on_plan_ = [&h, &most_loads, corrupt](const StepPlan& plan) {
      const int loads = static_cast<int>(std::count_if(plan.moves.begin(), plan.moves.end(),
                                                       [](const KvMove& m) { return m.kind == KvMove::Kind::kLoad; }));
      most_loads = std::max(most_loads, loads);
      // Overwrites the disk tier's file once blocks are in it.
      if (corrupt) {
        if (h.scheduler().tiers().stats().disk_blocks < 4 || h.steps_ % 5 != 0) return;
        std::FILE* f = std::fopen(h.tier_store_->disk_path().c_str(), "r+b");
        ASSERT_NE(f, nullptr);
        std::fseek(f, 0, SEEK_END);
        std::vector<char> junk(static_cast<size_t>(std::ftell(f)), 0x5a);
        std::rewind(f);
        std::fwrite(junk.data(), 1, junk.size(), f);
        std::fclose(f);
      }
    };
    const auto got = h.Run(arrivals);
    EXPECT_EQ(got, want);
    if (max_loads > 0) {
      EXPECT_EQ(most_loads, max_loads);  // reached, never passed
    } else {
      EXPECT_GT(most_loads, 3) << "a prompt's blocks load in one step";
    }
    const KvTierStats& ts = h.scheduler().tiers().stats();
    EXPECT_GT(ts.stores_total, 0);
    EXPECT_GT(ts.demotions_total, 0);
    EXPECT_GT(ts.host_loads_total + ts.disk_loads_total, 0);
    if (corrupt) {
      EXPECT_GT(ts.failed_moves_total, 0);
    } else {
      EXPECT_EQ(ts.failed_moves_total, 0);
      EXPECT_GT(ts.disk_loads_total, 0);
      int64_t cached = 0;
      for (const auto& [id, n] : h.cached_) cached += n;
      EXPECT_GT(cached, plain_cached) << "loaded prompt tokens count as cached";
    }
    EXPECT_TRUE(h.scheduler().tiers().CheckInvariants().ok());
    EXPECT_EQ(h.scheduler().cache_stats().used_chunks, 0);
    return ts.host_loads_total + ts.disk_loads_total;
  };
  const int64_t loads = tiered_run(false, false);
  tiered_run(true, false);
  tiered_run(false, true);
  // One load a step: the blocks still come back, later (a sequence whose
  // loads stopped at the bound would load one block and compute the rest:
  // a quarter of them here).
  EXPECT_GE(tiered_run(false, false, 1), loads * 9 / 10);
  tiered_run(true, false, 3);
}

// Two replicas over one Redis (the shared tier, write-through): replica A
// runs the tiered test's workload and writes its blocks; replica B, fresh,
// probes each request's blocks there and loads them instead of recomputing.
// Both give every request the tokens of the run without tiers (greedy and
// seeded, n = 2), and B recomputes fewer prompt tokens. With Redis killed
// mid-run, a third replica's loads fall back: the same outputs again.
TEST(SchedulerTest, SharedTierAcrossReplicasGivesTheSameOutputs) {
  RedisServerForTest redis("pw");
  ASSERT_TRUE(redis.Start()) << "cannot start redis-server (scripts/install-deps.sh installs it)";
  std::mt19937 rng(22);
  std::uniform_int_distribution<int> tok(0, 95);
  std::vector<std::vector<TokenId>> systems(6, std::vector<TokenId>(64));
  for (auto& s : systems) {
    for (auto& t : s) t = tok(rng);
  }
  std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> arrivals;
  for (int r = 0; r < 24; ++r) {
    RequestSpec spec;
    spec.prompt = systems[(r * 5) % 6];
    for (int k = 3 + r % 9; k > 0; --k) spec.prompt.push_back(tok(rng));
    spec.max_new_tokens = 3 + r % 4;
    spec.ignore_eos = true;
    spec.n = r % 7 == 3 ? 2 : 1;
    spec.cache_namespace = r % 3 == 0 ? "tenant-b" : "tenant-a";
    if (r % 2 == 1) {
      spec.sampling.temperature = 0.8f;
      spec.sampling.seed = 100 + r;
    }
    arrivals[8 * (r / 4)].emplace_back(r + 1, spec);
  }
  Harness plain(28, 2048, true);
  const auto want = plain.Run(arrivals);
  int64_t plain_cached = 0;
  for (const auto& [id, n] : plain.cached_) plain_cached += n;

  Harness a(28, 2048, true);
  a.UseSharedTier(redis.url());
  EXPECT_EQ(a.Run(arrivals), want);
  EXPECT_GT(a.scheduler().tiers().stats().shared_stores_total, 0);
  a.shared_store_->Flush();

  Harness b(28, 2048, true);
  b.UseSharedTier(redis.url());
  EXPECT_EQ(b.Run(arrivals), want);
  const KvTierStats& ts = b.scheduler().tiers().stats();
  EXPECT_GT(ts.shared_hits_total, 0);
  EXPECT_GT(ts.shared_loads_total, 0);
  EXPECT_EQ(ts.shared_fallbacks_total, 0);
  int64_t cached = 0;
  for (const auto& [id, n] : b.cached_) cached += n;
  EXPECT_GT(cached, plain_cached) << "loaded prompt tokens count as cached";
  EXPECT_TRUE(b.scheduler().tiers().CheckInvariants().ok());

  // Redis killed once C's first loads are planned: they fail, and the rest
  // is recomputed.
  Harness c(28, 2048, true);
  c.UseSharedTier(redis.url());
  c.on_plan_ = [&](const StepPlan& plan) {
    for (const KvMove& m : plan.moves) {
      if (m.tier == KvTier::kShared && m.kind == KvMove::Kind::kLoad) redis.Kill();
    }
  };
  EXPECT_EQ(c.Run(arrivals), want);
  EXPECT_GT(c.scheduler().tiers().stats().shared_fallbacks_total, 0);
  EXPECT_TRUE(c.scheduler().tiers().CheckInvariants().ok());
  EXPECT_EQ(c.scheduler().cache_stats().used_chunks, 0);
}

// All-greedy steps take the device-greedy path (the GPU's), and give the
// tokens the host Sampler gives alone runs.
TEST(SchedulerTest, DeviceGreedyPathMatchesSamplerPath) {
  ExpectSameAsAlone(256, 24, true, 5, false, 24, /*device_sampling=*/true);
  Harness h(256, 2048, true, /*device_sampling=*/true);
  Workload w = MakeWorkload(6, 6, 8);
  h.Run(w.arrivals);
  EXPECT_GT(h.device_model_->greedy_calls, 0);
  EXPECT_EQ(h.device_model_->sample_calls, 0);
  EXPECT_EQ(h.device_model_->host_calls, 0);
  // One request sampling at temperature 1 sends its steps through the
  // device's full sampler, still with no logits to the host.
  Harness mixed(256, 2048, true, /*device_sampling=*/true);
  RequestSpec hot = w.all[0].second;
  hot.sampling.temperature = 1;
  hot.sampling.seed = 3;
  hot.max_new_tokens = 4;
  mixed.Run({{0, {{100, hot}}}});
  EXPECT_GT(mixed.device_model_->sample_calls, 0);
  EXPECT_EQ(mixed.device_model_->host_calls, 0);
}

// Sampled requests (temperature, top-k/p, min-p, penalty histories, n = 2,
// chunked prefill) through the device sampler's algorithm give the tokens
// the host Sampler gives the same requests run alone.
TEST(SchedulerTest, DeviceSamplingPathMatchesSamplerPath) {
  ExpectSameAsAlone(256, 24, true, 7, false, 24, /*device_sampling=*/true, /*sampled=*/true);
  ExpectSameAsAlone(256, 2048, true, 8, false, 24, /*device_sampling=*/true, /*sampled=*/true);
}

// A constraint that scripts each sample's output: at position p < length
// three allowed tokens (from the request's seed, the sample and p), then
// either nothing (it ends on the last scripted token) or only EOS.
class ScriptConstraint : public TokenConstraint {
 public:
  ScriptConstraint(uint32_t seed, int length, bool end_with_eos, int samples)
      : seed_(seed), length_(length), end_with_eos_(end_with_eos), pos_(samples, 0) {}
  static std::vector<TokenId> Allowed(uint32_t seed, int sample, int pos) {
    const TokenId base = static_cast<TokenId>((seed * 31 + sample * 17 + pos * 7) % 90);
    return {base, base + 3, base + 5};
  }
  int32_t mask_words() const override { return 4; }  // 97 tokens
  bool FillNextTokenMask(int32_t sample, int32_t /*tokens_left*/, absl::Span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0);
    const int p = pos_[sample];
    std::vector<TokenId> allowed = p < length_ ? Allowed(seed_, sample, p) : std::vector<TokenId>{96};
    for (TokenId t : allowed) mask[t / 32] |= uint32_t{1} << (t % 32);
    return true;
  }
  bool Accept(int32_t sample, int32_t token) override {
    const int p = pos_[sample]++;
    if (p >= length_) return true;  // EOS
    const std::vector<TokenId> allowed = Allowed(seed_, sample, p);
    if (std::find(allowed.begin(), allowed.end(), token) == allowed.end()) ++violations_;
    return !end_with_eos_ && p + 1 == length_;
  }
  int violations_ = 0;

 private:
  uint32_t seed_;
  int length_;
  bool end_with_eos_;
  std::vector<int> pos_;
};

// Constrained requests beside unconstrained ones, sampled and greedy, n = 2,
// min_tokens, under preemption: every constrained token is one the
// constraint allowed, and each output ends where the constraint says
// ("stop"), not at max_new_tokens; the others are untouched (as alone).
TEST(SchedulerTest, ConstrainedSamplesDrawOnlyAllowedTokensAndEndWhereTheConstraintSays) {
  Workload w = MakeWorkload(3, 14, 80);  // the preemption test's workload
  std::map<RequestId, std::shared_ptr<ScriptConstraint>> constraints;
  std::map<RequestId, std::pair<int, bool>> script;  // length, ends with EOS
  for (auto* list : {&w.all}) {
    for (auto& [id, spec] : *list) {
      if (id % 2 == 1) continue;
      const int length = 30 + static_cast<int>(id * 5 % 40);
      const bool eos = id % 4 == 0;
      spec.max_new_tokens = 80;
      if (id % 3 != 0) {  // sampled: the mask applies before temperature and the draw
        spec.sampling.temperature = 1.0f;
        spec.sampling.seed = id;
      }
      spec.ignore_eos = id % 3 == 0;          // the constraint's end is not the model's EOS
      spec.min_tokens = id % 5 == 0 ? 30 : 0;  // nor held off by min_tokens
      script[id] = {length, eos};
    }
  }
  auto attach = [&](RequestId id, RequestSpec* spec) {
    if (script.count(id) == 0) return;
    constraints[id] = std::make_shared<ScriptConstraint>(static_cast<uint32_t>(id), script[id].first,
                                                         script[id].second, spec->n);
    spec->constraint = constraints[id];
  };
  // The workload with fresh constraints (they keep each sample's state).
  auto make_arrivals = [&] {
    std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> arrivals;
    for (auto& [at, list] : w.arrivals) {
      for (auto& [id, spec] : list) {
        RequestSpec s = spec;
        for (const auto& [aid, aspec] : w.all) {
          if (aid == id) s = aspec;
        }
        attach(id, &s);
        arrivals[at].emplace_back(id, s);
      }
    }
    return arrivals;
  };
  // Masks sent after their plan (the served engine's way) give the same run.
  Harness deferred(24, 64, true, false, /*defer_masks=*/true);
  const auto deferred_out = deferred.Run(make_arrivals());
  EXPECT_GT(deferred.deferred_steps_, 0);
  Harness h(24, 64, true);  // a small pool: preemption recomputes constrained requests too
  auto together = h.Run(make_arrivals());
  EXPECT_EQ(deferred_out, together);
  EXPECT_EQ(deferred.finish_, h.finish_);
  // And computed on a mask pool, several samples at once, inline or deferred.
  ThreadPool mask_pool(3);
  for (bool defer : {false, true}) {
    Harness pooled(24, 64, true, false, defer, &mask_pool);
    EXPECT_EQ(pooled.Run(make_arrivals()), together) << "deferred " << defer;
    EXPECT_EQ(pooled.finish_, h.finish_);
  }
  for (const auto& [id, spec] : w.all) {
    for (int i = 0; i < spec.n; ++i) {
      const std::pair<RequestId, int> key(id, i);
      if (script.count(id) == 0) {
        Harness alone(256, 2048, false);
        EXPECT_EQ(together[key], alone.Run({{0, {{id, spec}}}})[key]) << "unconstrained request " << id;
        continue;
      }
      const auto [length, eos] = script[id];
      const std::vector<TokenId>& got = together[key];
      ASSERT_EQ(got.size(), static_cast<size_t>(length + (eos ? 1 : 0))) << "request " << id << " sample " << i;
      for (int p = 0; p < length; ++p) {
        const auto allowed = ScriptConstraint::Allowed(static_cast<uint32_t>(id), i, p);
        EXPECT_NE(std::find(allowed.begin(), allowed.end(), got[p]), allowed.end()) << id << "/" << i << "@" << p;
      }
      if (eos) EXPECT_EQ(got.back(), 96);
      EXPECT_EQ(h.finish_[key], FinishReason::kStopToken) << "request " << id;
    }
    if (constraints.count(id) > 0) EXPECT_EQ(constraints[id]->violations_, 0);
  }
  EXPECT_GT(h.scheduler().stats().preemptions_total, 0);
  EXPECT_EQ(h.scheduler().cache_stats().used_chunks, 0);
}

// Constrained requests through the device sampler (the masks packed into
// its launch, as the GPU model packs them) beside unconstrained ones: the
// masks no longer send logits to the host, a constrained greedy sample never
// takes the unmasked device-greedy path, and every sample gets the tokens
// the host Sampler gives it under the same masks.
TEST(SchedulerTest, DeviceSamplingHonoursTokenMasks) {
  Workload w = MakeWorkload(9, 12, 40, /*sampled=*/true);  // greedy and sampled, penalties, n = 2
  std::set<RequestId> constrained;
  for (auto& [id, spec] : w.all) {
    if (id % 3 == 0) continue;
    constrained.insert(id);
    spec.max_new_tokens = 60;
  }
  auto length = [](RequestId id) { return 10 + static_cast<int>(id * 7 % 25); };
  // Constraints keep each sample's position: every run gets its own.
  auto arrivals = [&] {
    std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> out;
    for (const auto& [at, list] : w.arrivals) {
      for (const auto& [id, unused] : list) {
        RequestSpec spec;
        for (const auto& [aid, aspec] : w.all) {
          if (aid == id) spec = aspec;
        }
        if (constrained.count(id) > 0) {
          spec.constraint =
              std::make_shared<ScriptConstraint>(static_cast<uint32_t>(id), length(id), id % 2 == 0, spec.n);
        }
        out[at].emplace_back(id, spec);
      }
    }
    return out;
  };
  Harness host(256, 2048, true);
  Harness device(256, 2048, true, /*device_sampling=*/true);
  auto want = host.Run(arrivals());
  auto got = device.Run(arrivals());
  // Masks that follow the plan reach the device sampler after its forward
  // pass (Model::LateMasks), as a GPU worker overlaps them, with the same
  // tokens.
  Harness device_late(256, 2048, true, /*device_sampling=*/true, /*defer_masks=*/true);
  EXPECT_EQ(device_late.Run(arrivals()), want);
  EXPECT_GT(device_late.device_model_->late_mask_calls, 0);
  EXPECT_EQ(device_late.device_model_->host_calls, 0);
  int greedy_constrained = 0;
  for (const auto& [id, spec] : w.all) {
    for (int i = 0; i < spec.n; ++i) {
      const std::pair<RequestId, int> key(id, i);
      EXPECT_EQ(got[key], want[key]) << "request " << id << " sample " << i;
      if (constrained.count(id) == 0) continue;
      greedy_constrained += spec.sampling.temperature == 0;
      ASSERT_GE(got[key].size(), static_cast<size_t>(length(id))) << "request " << id << " sample " << i;
      for (int p = 0; p < length(id); ++p) {
        const auto allowed = ScriptConstraint::Allowed(static_cast<uint32_t>(id), i, p);
        EXPECT_NE(std::find(allowed.begin(), allowed.end(), got[key][p]), allowed.end()) << id << "/" << i << "@" << p;
      }
      EXPECT_EQ(device.finish_[key], FinishReason::kStopToken) << "request " << id;
    }
  }
  EXPECT_GT(greedy_constrained, 0);
  EXPECT_GT(device.device_model_->sample_calls, 0);
  EXPECT_EQ(device.device_model_->host_calls, 0);

  // A greedy constrained request alone: every step is all-greedy, and still
  // goes through the masked sampler, not the unmasked greedy one.
  RequestSpec greedy = w.all[0].second;
  greedy.sampling = SamplingParams();
  greedy.sampling.temperature = 0;
  greedy.n = 1;
  greedy.max_new_tokens = 60;
  greedy.constraint = std::make_shared<ScriptConstraint>(5, 20, false, 1);
  Harness alone(256, 2048, true, /*device_sampling=*/true);
  const std::vector<TokenId> tokens = alone.Run({{0, {{50, greedy}}}})[{50, 0}];
  ASSERT_EQ(tokens.size(), 20u);
  for (int p = 0; p < 20; ++p) {
    const auto allowed = ScriptConstraint::Allowed(5, 0, p);
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), tokens[p]), allowed.end()) << "greedy @" << p;
  }
  EXPECT_EQ(alone.device_model_->greedy_calls, 0);
  EXPECT_EQ(alone.device_model_->host_calls, 0);
}

TEST(SchedulerTest, InBatchSharingComputesTheCommonPrefixOnce) {
  Harness h(256, 2048, true);
  std::vector<TokenId> system(64);
  for (int i = 0; i < 64; ++i) system[i] = (i * 7) % 90;
  std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> arrivals;
  for (int r = 0; r < 6; ++r) {
    RequestSpec spec;
    spec.prompt = system;
    spec.prompt.push_back(r);
    spec.prompt.push_back(r + 1);
    spec.sampling.temperature = 0;
    spec.max_new_tokens = 3;
    arrivals[0].emplace_back(r + 1, spec);
  }
  h.Run(arrivals);
  // Peaks are since the last reset: after one, an idle scheduler's are zero.
  EXPECT_GT(h.scheduler().stats().peak_used_chunks, 0);
  h.scheduler().ResetPeaks();
  EXPECT_EQ(h.scheduler().stats().peak_used_chunks, 0);
  EXPECT_EQ(h.scheduler().stats().peak_unshared_chunks, 0);
  int zero = 0;
  for (const auto& [id, cached] : h.cached_) {
    if (cached == 0) {
      ++zero;
    } else {
      EXPECT_EQ(cached, 64) << "request " << id;
    }
  }
  EXPECT_EQ(zero, 1);
}

// Models keep their decode plan per context version, so the executor refuses
// a changed context that reuses the version in force (a network input).
TEST(PlanExecutorTest, RefusesANewContextWithTheVersionInForce) {
  auto weights = DummyWeights(TinyConfig(), {0, 1}, 7);
  ASSERT_TRUE(weights.ok());
  ModelOptions mo;
  mo.chunk_size = 16;
  mo.num_kv_chunks = 8;
  auto model = LlamaModel::Create(TinyConfig(), std::move(*weights), mo, nullptr, nullptr);
  ASSERT_TRUE(model.ok());
  PlanExecutor executor(model->get(), /*samples=*/false);
  StepResult result;
  StepPlan prefill;  // 5 tokens into chunk 0
  prefill.tokens = {1, 2, 3, 4, 5};
  prefill.prefill.prefix_len = {0};
  prefill.prefill.q_begin = {0, 5};
  prefill.prefill.chunk_begin = {0, 1};
  prefill.prefill.chunk_ids = {0};
  ASSERT_TRUE(executor.Execute(prefill, &result).ok());
  auto decode = [](int32_t chunk, uint64_t version) {
    StepPlan plan;
    plan.tokens = {9};
    plan.has_decode = true;
    plan.seq_len = {6};
    plan.has_context = true;
    ChunkContext& ctx = plan.context;
    ctx.version = version;
    ctx.seq_ids = {1};
    ctx.private_begin = {0};
    ctx.private_end = {1};
    ctx.private_chunk = {chunk};
    ctx.private_tokens = {6};
    return plan;
  };
  ASSERT_TRUE(executor.Execute(decode(0, 1), &result).ok());
  EXPECT_EQ(executor.Execute(decode(3, 1), &result).code(), absl::StatusCode::kInvalidArgument);
}

// Finding 2 of the reliability issue: a worker died (SIGSEGV) on a decode
// context with private_begin = -5, private_end = -4. Every field of a plan is
// checked before use: each of thousands of plans with one field set to a
// hostile value is rejected or executed, never a crash (run under ASan, never
// a write outside an array). The victim executor also runs every valid plan,
// so it holds real contexts and samplers when the bad ones arrive. (It found
// a second way in: a refused context let an older version back in over the
// model's cached plan for it. CHUNKATTN_TRACE_HOSTILE=1 prints each trial.)
TEST(PlanExecutorTest, HostilePlansAreRejectedOrExecutedNeverACrash) {
  Harness harness(96, 64, true);
  ModelConfig config = TinyConfig();
  ModelOptions mo;
  mo.chunk_size = 16;
  mo.num_kv_chunks = 96;
  auto model = LlamaModel::Create(config, DummyWeights(config, {0, 1}, 7).value(), mo, nullptr, nullptr).value();
  PlanExecutor victim(model.get(), true);
  std::mt19937 rng(21);
  int rejected = 0, executed = 0;
  const int32_t hostile[] = {-5, -4, -1, 0, 1, 15, 16, 17, 95, 96, 97, 1 << 20, 1 << 30, INT32_MAX, INT32_MIN};
  const bool trace = getenv("CHUNKATTN_TRACE_HOSTILE") != nullptr;
  harness.on_plan_ = [&](const StepPlan& plan) {
    // Usually the valid plan goes first, so the bad ones meet the context in
    // force; sometimes a bad one races it for a new context's version.
    const bool valid_first = !plan.has_context || rng() % 4 != 0;
    StepResult result;
    if (valid_first) (void)victim.Execute(plan, &result);
    for (int trial = 0; trial < 200; ++trial) {
      StepPlan bad = plan;
      // Every int field the worker reads, one chosen at random.
      std::vector<int32_t*> fields;
      std::vector<const char*> names;  // for a failure's message
      auto add = [&](std::vector<int32_t>& v, const char* name) {
        for (int32_t& x : v) fields.push_back(&x), names.push_back(name);
      };
      add(bad.tokens, "tokens");
      add(bad.prefill.prefix_len, "prefix_len");
      add(bad.prefill.q_begin, "q_begin");
      add(bad.prefill.chunk_begin, "chunk_begin");
      add(bad.prefill.chunk_ids, "chunk_ids");
      if (bad.has_context) {
        add(bad.context.shared_chunk, "shared_chunk");
        add(bad.context.shared_begin, "shared_begin");
        add(bad.context.shared_end, "shared_end");
        add(bad.context.shared_tokens, "shared_tokens");
        add(bad.context.private_begin, "private_begin");
        add(bad.context.private_end, "private_end");
        add(bad.context.private_chunk, "private_chunk");
        add(bad.context.private_tokens, "private_tokens");
      }
      add(bad.seq_len, "seq_len");
      add(bad.logits_rows, "logits_rows");
      for (KvCopy& c : bad.copies) {
        fields.push_back(&c.src_chunk), names.push_back("copy.src");
        fields.push_back(&c.dst_chunk), names.push_back("copy.dst");
        fields.push_back(&c.num_tokens), names.push_back("copy.num_tokens");
      }
      for (SampleRow& r : bad.samples) fields.push_back(&r.row), names.push_back("sample.row");
      for (SamplerStart& st : bad.sampler_starts) add(st.history, "history");
      if (fields.empty()) break;
      const size_t pick = rng() % fields.size();
      int32_t* field = fields[pick];
      if (trace) std::fprintf(stderr, "step %d: %s (was %d)\n", static_cast<int>(plan.step), names[pick], *field);
      *field = rng() % 3 == 0 ? *field + static_cast<int32_t>(rng() % 3) - 1 : hostile[rng() % std::size(hostile)];
      // Sometimes a length is off instead.
      if (rng() % 8 == 0 && !bad.context.private_tokens.empty()) bad.context.private_tokens.pop_back();
      if (rng() % 8 == 0 && !bad.seq_len.empty()) bad.seq_len.push_back(3);
      if (rng() % 16 == 0 && bad.context.version > 0) --bad.context.version;  // an old version again
      if (rng() % 8 == 0 && !bad.samples.empty()) {  // a token mask: too long, empty of tokens, or random
        std::vector<uint32_t>& allowed = bad.samples[rng() % bad.samples.size()].allowed;
        allowed.assign(1 + rng() % 6, 0);
        if (rng() % 2 == 0) {
          for (uint32_t& w : allowed) w = static_cast<uint32_t>(rng());
        } else if (allowed.size() == 4) {
          allowed[3] = ~uint32_t{1};  // only tokens past the vocabulary (97)
        }
      }
      if (trace) std::fprintf(stderr, "  -> %d\n", *field);
      const absl::Status st = victim.Execute(bad, &result);
      if (trace) std::fprintf(stderr, "  : %s\n", st.ToString().c_str());
      (st.ok() ? executed : rejected)++;
    }
    if (!valid_first) (void)victim.Execute(plan, &result);  // refused when a bad one took its version
  };
  Workload w = MakeWorkload(5, 12, 10);
  harness.Run(w.arrivals);
  EXPECT_GT(rejected, 100);
  std::printf("hostile plans: %d rejected, %d executed\n", rejected, executed);
}

// A worker drains mid-workload: what started finishes (preempted requests
// included), nothing new starts, and the queue handed to the next session's
// scheduler (a fresh pool, as after the workers re-join) gives every request
// its tokens of a run alone.
TEST(SchedulerTest, HandOverFinishesTheStartedAndKeepsTheQueue) {
  Workload w = MakeWorkload(3, 14, 80);
  Harness first(24, 64, true);
  first.hand_over_at_ = 70;
  auto before = first.Run(w.arrivals);
  EXPECT_EQ(first.scheduler().cache_stats().used_chunks, 0);
  EXPECT_GT(first.scheduler().stats().preemptions_total, 0);  // a small pool: preempted ones count as started
  const std::vector<RequestId> ids = first.scheduler().RequestIds();
  auto queued = first.scheduler().TakeQueued();
  ASSERT_EQ(queued.size(), ids.size());
  ASSERT_FALSE(queued.empty());
  EXPECT_FALSE(first.scheduler().HasWork());

  Harness second(24, 64, true);
  std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> again;
  for (size_t k = 0; k < queued.size(); ++k) {
    EXPECT_EQ(queued[k].first, ids[k]);  // admission order kept
    again[0].push_back(queued[k]);
  }
  auto after = second.Run(again);
  int started = 0;
  for (const auto& [id, spec] : w.all) {
    const bool was_queued = std::count(ids.begin(), ids.end(), id) > 0;
    started += !was_queued;
    Harness alone(256, 2048, false);
    auto ref = alone.Run({{0, {{id, spec}}}});
    for (int i = 0; i < spec.n; ++i) {
      const std::pair<RequestId, int> key(id, i);
      EXPECT_EQ(was_queued ? before.count(key) : after.count(key), 0u) << "request " << id << " ran in both";
      EXPECT_EQ(was_queued ? after[key] : before[key], ref[key]) << "request " << id << " sample " << i;
    }
  }
  EXPECT_GT(started, 0);
  EXPECT_EQ(second.scheduler().cache_stats().used_chunks, 0);
}

TEST(SchedulerTest, RejectsRequestsThatCanNeverFit) {
  Harness h(8, 64, true);
  RequestSpec spec;
  spec.prompt.assign(100, 1);
  spec.max_new_tokens = 40;  // 140 tokens = 9 chunks of 16
  EXPECT_TRUE(absl::IsResourceExhausted(h.scheduler().Add(1, spec)));
  spec.max_new_tokens = 500;
  EXPECT_TRUE(absl::IsInvalidArgument(h.scheduler().Add(2, spec)));
  spec.max_new_tokens = 4;
  spec.n = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(h.scheduler().Add(3, spec)));
  spec.n = 1;
  EXPECT_TRUE(h.scheduler().Add(4, spec).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(h.scheduler().Add(4, spec)));
  spec.prompt.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(h.scheduler().Add(5, spec)));
}

// A greedy request of 3 tokens from `tenant` (its own cache namespace).
RequestSpec TenantSpec(std::vector<TokenId> prompt, const std::string& tenant,
                       std::optional<RetentionSpec> retention) {
  RequestSpec spec;
  spec.prompt = std::move(prompt);
  spec.sampling.temperature = 0;
  spec.max_new_tokens = 3;
  spec.ignore_eos = true;
  spec.tenant = tenant;
  spec.cache_namespace = tenant;
  spec.retention = retention;
  return spec;
}

// Each request's first sample in `out` equals its run alone (greedy), and
// has all of its `tokens`: served to the end.
void ExpectEachAsAlone(std::map<std::pair<RequestId, int>, std::vector<TokenId>> out,
                       const std::vector<std::pair<RequestId, RequestSpec>>& all, size_t tokens) {
  for (const auto& [id, spec] : all) {
    Harness alone(256, 2048, false);
    auto ref = alone.Run({{0, {{id, spec}}}});
    const std::pair<RequestId, int> key(id, 0);
    EXPECT_EQ(out[key], ref[key]) << "request " << id;
    EXPECT_EQ(out[key].size(), tokens) << "request " << id;
  }
}

// Retention (issue 41): tenant a's system prompt, retained, survives a
// flood of tenant b's prompts that evicts it without retention; a tenant
// retaining every prompt holds at most its bound of raised chunks (a
// quarter of the pool by default) and b's requests are all served; every
// greedy output equals its run alone, retention or not.
TEST(SchedulerTest, RetentionKeepsATenantsPrefixWithinItsBoundAndChangesNoOutput) {
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> tok(0, 95);
  auto prompt = [&](int tokens) {
    std::vector<TokenId> p(tokens);
    for (auto& t : p) t = tok(rng);
    return p;
  };
  const auto spec_of = TenantSpec;
  const std::vector<TokenId> system = prompt(64);  // four chunks of 16
  std::vector<std::vector<TokenId>> flood, pins;
  for (int k = 0; k < 8; ++k) flood.push_back(prompt(64));
  for (int k = 0; k < 3; ++k) pins.push_back(prompt(64));
  RetentionSpec keep;
  keep.priority = 80;
  keep.duration = absl::Hours(1);
  for (const bool retained : {false, true}) {
    SCOPED_TRACE(retained ? "retained" : "plain LRU");
    std::optional<RetentionSpec> r;
    if (retained) r = keep;
    std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> arrivals;
    std::vector<std::pair<RequestId, RequestSpec>> all;
    auto add = [&](int step, RequestId id, RequestSpec spec) {
      arrivals[step].emplace_back(id, spec);
      all.emplace_back(id, std::move(spec));
    };
    add(0, 1, spec_of(system, "a", r));
    for (int k = 0; k < 8; ++k) add(4 + 4 * k, 10 + k, spec_of(flood[k], "b", std::nullopt));
    add(60, 2, spec_of(system, "a", std::nullopt));  // the same prompt again, nothing asked
    // Then a pins three more prompts (12 chunks, over its bound of 6) while b goes on.
    for (int k = 0; k < 3; ++k) add(64 + k, 20 + k, spec_of(pins[k], "a", r));
    for (int k = 0; k < 4; ++k) add(64 + k, 30 + k, spec_of(flood[k], "b", std::nullopt));
    Harness h(24, 2048, true);
    int32_t most_raised = 0;
    h.on_plan_ = [&](const StepPlan&) {
      for (const auto& [ns, n] : h.scheduler().forest().RaisedPerNamespace()) {
        EXPECT_EQ(ns, "a");
        most_raised = std::max(most_raised, n);
      }
    };
    ExpectEachAsAlone(h.Run(arrivals), all, 3);
    if (retained) {
      EXPECT_EQ(h.cached_[2], 63);  // every prompt chunk still cached (the last token recomputed)
      EXPECT_EQ(most_raised, 6);    // 24 chunks / 4
      EXPECT_GT(h.scheduler().stats().retention_capped_chunks, 0);
      EXPECT_GT(h.scheduler().cache_stats().band_evictions_total[static_cast<int>(RetentionBand::kDefault)], 0);
    } else {
      EXPECT_LT(h.cached_[2], 16);  // evicted by the flood
      EXPECT_EQ(most_raised, 0);
    }
    EXPECT_EQ(h.scheduler().cache_stats().used_chunks, 0);
  }
}

// Retention with a host tier under the pool: tenant b's concurrent prompts
// push tenant a's retained chunks out of the pool; they keep their grants
// in the tier and still count against a's bound, so a's next pin is capped
// (the bound counts pool and tiers together), and a's prompt asked again
// loads back with its grants. Outputs equal the runs alone.
TEST(SchedulerTest, RetentionBoundCountsTheTiersToo) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(0, 95);
  auto prompt = [&] {
    std::vector<TokenId> p(64);  // four chunks of 16
    for (auto& t : p) t = tok(rng);
    return p;
  };
  RetentionSpec keep;
  keep.priority = 80;
  keep.duration = absl::Hours(1);
  auto spec_of = [&](std::vector<TokenId> p, const std::string& tenant, bool retain) {
    return TenantSpec(std::move(p), tenant, retain ? std::optional<RetentionSpec>(keep) : std::nullopt);
  };
  const std::vector<TokenId> a0 = prompt(), a1 = prompt(), a2 = prompt();
  std::map<int, std::vector<std::pair<RequestId, RequestSpec>>> arrivals;
  std::vector<std::pair<RequestId, RequestSpec>> all;
  auto add = [&](int step, RequestId id, RequestSpec spec) {
    arrivals[step].emplace_back(id, spec);
    all.emplace_back(id, std::move(spec));
  };
  add(0, 1, spec_of(a0, "a", true));  // 4 chunks raised
  add(6, 2, spec_of(a1, "a", true));  // 2 more: the bound of 6
  for (int k = 0; k < 4; ++k) add(12, 10 + k, spec_of(prompt(), "b", false));  // 20 chunks at once
  add(30, 3, spec_of(a2, "a", true));   // over the bound wherever the 6 are
  add(40, 4, spec_of(a0, "a", false));  // loads back what the tier kept
  KvTierOptions tiers;
  Harness probe(8, 64, true);
  tiers.host_bytes = 40 * (KvTierStore::kHeaderBytes + probe.chunk_bytes_);
  Harness h(24, 2048, true, false, false, nullptr, tiers);
  h.SetRetainedBound(6);
  int64_t most = 0, most_in_tier = 0;
  h.on_plan_ = [&](const StepPlan&) {
    int64_t total = 0;
    for (const auto& [ns, n] : h.scheduler().RaisedPerNamespace()) {
      EXPECT_EQ(ns, "a");
      total += n;
    }
    most = std::max(most, total);
    int64_t in_tier = 0;
    for (const auto& [ns, n] : h.scheduler().tiers().RaisedPerNamespace()) in_tier += n;
    most_in_tier = std::max(most_in_tier, in_tier);
  };
  ExpectEachAsAlone(h.Run(arrivals), all, 3);
  EXPECT_EQ(most, 6);
  EXPECT_GT(most_in_tier, 0) << "b's prompts never pushed a's raised chunks into the tier";
  EXPECT_GE(h.scheduler().stats().retention_capped_chunks, 4) << "a2 was raised past the bound";
  EXPECT_GT(h.scheduler().tiers().stats().host_loads_total, 0);
  // a0 from the pool and the tier: whole blocks before its last token's.
  EXPECT_GE(h.cached_[4], 48);
  // What a0 loaded came back with its grants: fewer raised in the tier
  // than at most, the six still raised in all.
  int64_t pool_raised = 0, tier_raised = 0;
  for (const auto& [ns, n] : h.scheduler().forest().RaisedPerNamespace()) pool_raised += n;
  for (const auto& [ns, n] : h.scheduler().tiers().RaisedPerNamespace()) tier_raised += n;
  EXPECT_LT(tier_raised, most_in_tier);
  EXPECT_EQ(pool_raised + tier_raised, 6);
  EXPECT_TRUE(h.scheduler().tiers().CheckInvariants().ok());
}

TEST(SchedulerTest, RetentionOutsideItsRangesIsRefused) {
  Harness h(64, 2048, true);
  RequestSpec spec;
  spec.prompt.assign(40, 3);
  spec.max_new_tokens = 4;
  for (RetentionSpec bad : {RetentionSpec{-1}, RetentionSpec{34}, RetentionSpec{101}, RetentionSpec{50, absl::ZeroDuration()},
                            RetentionSpec{50, absl::Seconds(-5)}, RetentionSpec{50, absl::Hours(24 * 31)},
                            RetentionSpec{50, absl::Hours(1), 41}, RetentionSpec{50, absl::Hours(1), -1}}) {
    spec.retention = bad;
    EXPECT_TRUE(absl::IsInvalidArgument(h.scheduler().Add(1, spec))) << bad.priority;
  }
  spec.retention = RetentionSpec{50, absl::Hours(1), 40};
  EXPECT_TRUE(h.scheduler().Add(1, spec).ok());
}

TEST(SchedulerTest, AbortMidStreamReleasesEverything) {
  Harness h(64, 2048, true);
  RequestSpec spec;
  spec.prompt.assign(40, 3);
  spec.max_new_tokens = 100;
  spec.ignore_eos = true;
  ASSERT_TRUE(h.scheduler().Add(1, spec).ok());
  StepPlan plan;
  ASSERT_TRUE(*h.scheduler().Schedule(&plan));
  testing::ExpectPlanWithinLimits(plan, h.scheduler().options());
  StepResult result;
  result.tokens = {5};
  result.logprobs = {-1};
  std::vector<SampleEvent> events;
  ASSERT_TRUE(h.scheduler().Complete(result, &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_GT(h.scheduler().cache_stats().used_chunks, 0);
  h.scheduler().Abort(1);
  EXPECT_EQ(h.scheduler().cache_stats().used_chunks, 0);
  EXPECT_FALSE(h.scheduler().HasWork());
  EXPECT_TRUE(h.scheduler().forest().CheckInvariants().ok());
}

TEST(SubsetContextTest, KeepsEveryPathOfTheKeptSequences) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    PrefixForestOptions fo;
    fo.chunk_size = 16;
    fo.num_chunks = 400;
    auto forest = PrefixForest::Create(fo);
    ASSERT_TRUE(forest.ok());
    std::vector<TokenId> base(80);
    for (auto& t : base) t = rng() % 5;
    for (int s = 0; s < 10; ++s) {
      std::vector<TokenId> p(base.begin(), base.begin() + (rng() % 80) + 1);
      for (int k = rng() % 40; k > 0; --k) p.push_back(rng() % 5);
      auto ins = (*forest)->Insert(p);
      ASSERT_TRUE(ins.ok());
      ASSERT_TRUE((*forest)->MarkComputed(ins->seq_id).ok());
    }
    const ChunkContext& full = (*forest)->Context();
    std::vector<bool> keep(full.num_seqs());
    for (size_t s = 0; s < keep.size(); ++s) keep[s] = rng() % 2;
    ChunkContext sub;
    SubsetContext(full, keep, 9, &sub);
    ASSERT_TRUE(ValidateChunkContext(sub, fo.num_chunks).ok()) << ValidateChunkContext(sub, 400);
    EXPECT_EQ(sub.version, 9u);
    int t = 0;
    for (int s = 0; s < full.num_seqs(); ++s) {
      if (!keep[s]) continue;
      EXPECT_EQ(sub.seq_ids[t], full.seq_ids[s]);
      EXPECT_EQ(SequenceChunks(sub, t), SequenceChunks(full, s));
      ++t;
    }
    EXPECT_EQ(t, sub.num_seqs());
    for (int k = 0; k < sub.num_shared(); ++k) EXPECT_GE(sub.shared_end[k] - sub.shared_begin[k], 2);
  }
}

}  // namespace
}  // namespace chunkattn
