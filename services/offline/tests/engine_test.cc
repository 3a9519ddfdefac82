// The local engine (the Scheduler and a PlanExecutor in one process): a batch
// whose prompts share prefixes generates exactly what each prompt generates
// alone, while computing the shared tokens once.
#include "services/offline/offline_engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "base/tests/temp_dir.h"
#include "gtest/gtest.h"
#include "workers/tests/device_sampling_model.h"
#include "workers/tests/model_test_util.h"

namespace chunkattn {
namespace {

std::unique_ptr<OfflineEngine> MakeEngine(Model* model) {
  auto engine = OfflineEngine::Create(model);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

ModelOptions Options(int64_t chunks = 128) {
  ModelOptions o;
  o.chunk_size = 16;
  o.num_kv_chunks = chunks;
  return o;
}

std::vector<GenerationRequest> SharedPrefixRequests(const std::vector<int32_t>& base,
                                                    const SamplingParams& sampling) {
  // Prompts 0, 1, 3 share 40 tokens (2 full chunks of 16); 4 repeats 1.
  std::vector<std::vector<int32_t>> prompts;
  for (int variant : {0, 1, -1, 2, 1}) {
    std::vector<int32_t> p;
    if (variant < 0) {
      p.assign(base.rbegin(), base.rbegin() + 30);  // unrelated
    } else {
      p.assign(base.begin(), base.begin() + 40);
      for (int i = 0; i < 3 + 4 * variant; ++i) p.push_back((base[i] + 11 * (variant + 1)) % 256);
    }
    prompts.push_back(p);
  }
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.sampling = sampling;
    r.sampling.seed = 100 + i;
    r.max_new_tokens = 10 + static_cast<int>(i);
    r.ignore_eos = true;
    requests.push_back(r);
  }
  return requests;
}

TEST(OfflineEngineTest, BatchWithSharedPrefixesMatchesEachPromptAlone) {
  const auto& ref = testing::References()[1];
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams sampled;
  sampled.temperature = 0.9f;
  sampled.top_p = 0.9f;
  sampled.top_k = 50;
  for (const SamplingParams& sampling : {greedy, sampled}) {
    const auto requests = SharedPrefixRequests(ref.prompts.back(), sampling);
    auto model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options());
    auto engine = MakeEngine(model.get());
    GenerationStats stats;
    auto batch = engine->Generate(requests, &stats);
    ASSERT_TRUE(batch.ok()) << batch.status();
    // 1, 3 and 4 wait one step for 0, which computes the 40 shared tokens
    // (token-granular: 2 chunks and 8 tokens of a third, copied on write);
    // then each takes them from the cache.
    EXPECT_EQ(stats.cached_prompt_tokens, 3 * 40);
    for (int i : {1, 3, 4}) EXPECT_EQ((*batch)[i].cached_prompt_tokens, 40) << "request " << i;
    EXPECT_LT(stats.peak_chunks, stats.peak_logical_chunks);
    // The step timing chunkattn-generate reports (its decode step for bench/peer).
    EXPECT_GT(stats.steps, 1);
    EXPECT_GT(stats.first_step_seconds, 0);
    EXPECT_GT(stats.steps_seconds, stats.first_step_seconds);
    for (size_t i = 0; i < requests.size(); ++i) {
      auto solo_model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options());
      auto solo = MakeEngine(solo_model.get());
      auto alone = solo->Generate({requests[i]});
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_EQ((*batch)[i].tokens, (*alone)[0].tokens) << "request " << i;
      EXPECT_EQ((*batch)[i].finish_reason, "length");
      ASSERT_EQ((*batch)[i].logprobs.size(), (*alone)[0].logprobs.size());
      for (size_t t = 0; t < (*alone)[0].logprobs.size(); ++t) {
        EXPECT_NEAR((*batch)[i].logprobs[t], (*alone)[0].logprobs[t], 1e-4);
        EXPECT_LE((*batch)[i].logprobs[t], 0.0f);
      }
    }
  }
}

// KV tiers under a pool of 12 chunks: calls of prompts on prefix A, then
// on three others (evicting A's chunks), then on A again. With a host tier, a
// disk tier, or both written through, the third call loads A's blocks
// instead of recomputing them, and every call's tokens equal the engine's
// without tiers (greedy and seeded sampling).
TEST(OfflineEngineTest, KvTiersLoadWhatThePoolEvictedAcrossCalls) {
  const auto& ref = testing::References()[1];
  std::mt19937 rng(5);
  auto prompts_on = [&](int seed_offset) {
    std::vector<int32_t> prefix(48);
    for (auto& t : prefix) t = static_cast<int32_t>((rng() + seed_offset) % 256);
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < 3; ++i) {
      GenerationRequest r;
      r.prompt = prefix;
      for (int k = 0; k < 5 + 3 * i; ++k) r.prompt.push_back(static_cast<int32_t>(rng() % 256));
      r.max_new_tokens = 6;
      r.ignore_eos = true;
      if (i == 1) {
        r.sampling.temperature = 0.8f;
        r.sampling.seed = 9 + seed_offset;
      } else {
        r.sampling.temperature = 0;
      }
      requests.push_back(r);
    }
    return requests;
  };
  const std::vector<GenerationRequest> a = prompts_on(0);
  std::vector<GenerationRequest> b_;  // three prefixes: more than the pool holds beside A's
  for (int p = 1; p <= 3; ++p) {
    for (GenerationRequest& r : prompts_on(p)) b_.push_back(std::move(r));
  }
  const std::vector<GenerationRequest>& b = b_;
  auto run = [&](const OfflineEngineOptions& options, std::vector<GenerationStats>* stats) {
    auto model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options(12));
    auto engine = OfflineEngine::Create(model.get(), options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<std::vector<int32_t>> tokens;
    for (const auto* requests : {&a, &b, &a}) {
      GenerationStats st;
      auto out = (*engine)->Generate(*requests, &st);
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return tokens;
      for (const GenerationResult& r : *out) tokens.push_back(r.tokens);
      stats->push_back(st);
    }
    return tokens;
  };
  std::vector<GenerationStats> plain_stats;
  const auto want = run(OfflineEngineOptions(), &plain_stats);
  ASSERT_EQ(want.size(), 15u);
  const std::string dir = testing::MakeTempDir("offline-tiers");
  ASSERT_FALSE(dir.empty());
  auto model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options(12));
  const int64_t slot = KvTierStore::kHeaderBytes + model->kv_chunk_bytes();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "host" : variant == 1 ? "disk" : "host and disk, write-through");
    OfflineEngineOptions options;
    if (variant != 1) options.tiers.host_bytes = (variant == 0 ? 16 : 2) * slot;
    if (variant != 0) {
      options.tiers.disk_dir = dir;
      options.tiers.disk_bytes = 16 * slot;
    }
    options.tier_write_through = variant == 2;
    std::vector<GenerationStats> stats;
    EXPECT_EQ(run(options, &stats), want);
    ASSERT_EQ(stats.size(), 3u);
    EXPECT_GT(stats[0].tier_writes + stats[1].tier_writes, 0);
    EXPECT_GT(stats[2].tier_loads, 0);
    EXPECT_GT(stats[2].cached_prompt_tokens, plain_stats[2].cached_prompt_tokens);
  }
  OfflineEngineOptions bad;
  bad.tiers.disk_dir = dir + "/missing";
  bad.tiers.disk_bytes = 16 * slot;
  EXPECT_FALSE(OfflineEngine::Create(model.get(), bad).ok());
}

// A model that samples on its device (the GPU path, here the GPU sampler's
// algorithm on the host) generates what the host Sampler does, with no
// logits to the host; a logits observer sends the steps through the host.
TEST(OfflineEngineTest, DeviceSamplingMatchesTheHostSampler) {
  const auto& ref = testing::References()[1];
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  sampled.top_p = 0.95f;
  sampled.top_k = 40;
  sampled.min_p = 0.02f;
  sampled.repetition_penalty = 1.2f;
  const auto requests = SharedPrefixRequests(ref.prompts.back(), sampled);
  auto host_model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options());
  auto host = MakeEngine(host_model.get());
  auto want = host->Generate(requests);
  ASSERT_TRUE(want.ok()) << want.status();
  testing::DeviceSamplingModel device_model(testing::LoadModelOrDie(ref.dir, {}, nullptr, Options()));
  auto device = MakeEngine(&device_model);
  auto got = device->Generate(requests);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GT(device_model.sample_calls, 0);
  EXPECT_EQ(device_model.host_calls, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "request " << i;
    ASSERT_EQ((*got)[i].logprobs.size(), (*want)[i].logprobs.size());
    for (size_t t = 0; t < (*want)[i].logprobs.size(); ++t) {
      EXPECT_NEAR((*got)[i].logprobs[t], (*want)[i].logprobs[t], 1e-4);
    }
  }
  // An observer sees every sampled row of every request, once per token.
  std::vector<int> observed(requests.size(), 0);
  device->set_logits_observer([&](const std::vector<int>& rows, absl::Span<const float> logits) {
    EXPECT_EQ(logits.size(), rows.size() * static_cast<size_t>(device_model.config().vocab_size));
    for (int r : rows) {
      if (r >= 0) ++observed[r];
    }
  });
  auto watched = device->Generate(requests);
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_GT(device_model.host_calls, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*watched)[i].tokens, (*want)[i].tokens) << "request " << i;
    EXPECT_EQ(observed[i], static_cast<int>((*want)[i].tokens.size())) << "request " << i;
  }
}

// Reference 0's prompt 2, greedy, for its 8 reference tokens.
GenerationRequest GreedyPrompt2(const testing::Reference& ref) {
  GenerationRequest r;
  r.prompt = ref.prompts[2];
  r.sampling.temperature = 0;
  r.max_new_tokens = 8;
  return r;
}

TEST(OfflineEngineTest, StopsOnStopTokensAndEos) {
  const auto& ref = testing::References()[0];
  auto model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options());
  auto engine = MakeEngine(model.get());
  GenerationRequest r = GreedyPrompt2(ref);
  auto free_run = engine->Generate({r});
  ASSERT_TRUE(free_run.ok());
  EXPECT_EQ((*free_run)[0].tokens, ref.greedy[2]);
  r.stop_token_ids = {ref.greedy[2][3]};
  auto stopped = engine->Generate({r});
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ((*stopped)[0].finish_reason, "stop");
  const auto& g = ref.greedy[2];
  const size_t first = std::find(g.begin(), g.end(), g[3]) - g.begin();
  EXPECT_EQ((*stopped)[0].tokens, std::vector<int32_t>(g.begin(), g.begin() + first + 1));
}

// min_tokens: the worker masks the stop tokens (and EOS) until then, on the
// host path even for a model that samples on its device; later a stop token
// ends the request as usual.
TEST(OfflineEngineTest, MinTokensMasksStopTokensUntilThen) {
  const auto& ref = testing::References()[0];
  const auto& g = ref.greedy[2];
  auto model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options());
  auto engine = MakeEngine(model.get());
  GenerationRequest r = GreedyPrompt2(ref);
  r.stop_token_ids = {g[0]};
  auto stopped = engine->Generate({r});
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ((*stopped)[0].tokens, std::vector<int32_t>{g[0]});
  // Every token the free run produced is a stop token, held off for all 8.
  r.stop_token_ids.assign(g.begin(), g.end());
  r.min_tokens = 8;
  r.ignore_eos = false;
  auto held = engine->Generate({r});
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ((*held)[0].tokens.size(), 8u);
  EXPECT_EQ((*held)[0].finish_reason, "length");
  for (int32_t t : (*held)[0].tokens) {
    EXPECT_EQ(std::count(g.begin(), g.end(), t), 0) << t;
    EXPECT_FALSE(std::count(model->config().eos_token_ids.begin(), model->config().eos_token_ids.end(), t));
  }
  // Held for 2 only: the third token may stop, and the output ends at the
  // first stop token from there on.
  r.stop_token_ids = {g[0]};
  r.min_tokens = 2;
  auto two = engine->Generate({r});
  ASSERT_TRUE(two.ok()) << two.status();
  const auto& t = (*two)[0].tokens;
  ASSERT_GE(t.size(), 2u);
  EXPECT_NE(t[0], g[0]);
  EXPECT_NE(t[1], g[0]);
  for (size_t k = 2; k + 1 < t.size(); ++k) EXPECT_NE(t[k], g[0]);
  EXPECT_EQ((*two)[0].finish_reason, t.size() < 8 ? "stop" : "length");
  // A device-sampling model gives the same tokens, through its host path
  // while masking and its device path after.
  testing::DeviceSamplingModel device_model(testing::LoadModelOrDie(ref.dir, {}, nullptr, Options()));
  auto device = MakeEngine(&device_model);
  r.min_tokens = 8;
  r.stop_token_ids.assign(g.begin(), g.end());
  GenerationRequest after = r;
  after.min_tokens = 0;
  after.stop_token_ids.clear();
  auto both = device->Generate({r, after});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ((*both)[0].tokens, (*held)[0].tokens);
  EXPECT_EQ((*both)[1].tokens, g);
  EXPECT_GT(device_model.host_calls, 0);
  r.min_tokens = 9;  // over max_new_tokens
  EXPECT_EQ(engine->Generate({r}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OfflineEngineTest, RejectsBadRequests) {
  const auto& ref = testing::References()[0];
  auto model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options(8));
  auto engine = MakeEngine(model.get());
  GenerationRequest good;
  good.prompt = {5, 6, 7};
  good.max_new_tokens = 4;
  ASSERT_TRUE(engine->Generate({good}).ok());
  auto code = [&](GenerationRequest r) { return engine->Generate({good, r}).status().code(); };
  GenerationRequest r = good;
  r.prompt.clear();
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.prompt[1] = 999;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.max_new_tokens = 300;  // past the 256-token context
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.sampling.top_p = 0;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.prompt.assign(130, 9);  // 150 tokens: 10 chunks, over the pool of 8 even alone
  r.max_new_tokens = 20;
  EXPECT_EQ(code(r), absl::StatusCode::kResourceExhausted);
  // Nothing of a refused batch stays behind.
  EXPECT_FALSE(engine->scheduler().HasWork());
  EXPECT_EQ(engine->scheduler().cache_stats().used_chunks, 0);
  // 7 chunks beside good's 1 fill the pool of 8: the chunks the earlier
  // batches left cached are evicted for them.
  r.prompt.assign(100, 9);
  r.max_new_tokens = 12;
  r.ignore_eos = true;
  auto both = engine->Generate({good, r});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ((*both)[1].tokens.size(), 12u);
}

// top_logprobs end to end in one process: the host Sampler and a device
// sampling model (its host fallback) report the same entries, the greedy
// token leads them with its own logprob, a request that asks none gets none,
// and the first token's entries are the reference's log-softmax.
TEST(OfflineEngineTest, TopLogprobsFollowEveryTokenOnBothPaths) {
  const auto& ref = testing::References()[1];
  std::vector<GenerationRequest> requests(3);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].prompt = ref.prompts[i + 1];
    requests[i].max_new_tokens = 6;
    requests[i].ignore_eos = true;
    requests[i].sampling.seed = 7 + i;
  }
  requests[0].sampling.temperature = 0;
  requests[0].sampling.top_logprobs = 5;
  requests[1].sampling.temperature = 0.8f;
  requests[1].sampling.repetition_penalty = 1.3f;
  requests[1].sampling.top_logprobs = kMaxTopLogprobs;
  requests[2].sampling.temperature = 0;  // asks none
  auto host_model = testing::LoadModelOrDie(ref.dir, {}, nullptr, Options());
  auto want = MakeEngine(host_model.get())->Generate(requests);
  ASSERT_TRUE(want.ok()) << want.status();
  testing::DeviceSamplingModel device_model(testing::LoadModelOrDie(ref.dir, {}, nullptr, Options()));
  auto got = MakeEngine(&device_model)->Generate(requests);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(device_model.greedy_calls, 0) << "top_logprobs takes the sampling path";
  EXPECT_EQ(device_model.host_calls, 0);

  const int vocab = host_model->config().vocab_size;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationResult &w = (*want)[i], &g = (*got)[i];
    const size_t n = requests[i].sampling.top_logprobs;
    ASSERT_EQ(g.tokens, w.tokens) << "request " << i;
    ASSERT_EQ(w.top_token_ids.size(), n > 0 ? w.tokens.size() : 0) << "request " << i;
    ASSERT_EQ(g.top_token_ids, w.top_token_ids) << "request " << i;
    ASSERT_EQ(g.top_logprobs.size(), w.top_logprobs.size());
    for (size_t t = 0; t < w.top_token_ids.size(); ++t) {
      ASSERT_EQ(w.top_token_ids[t].size(), n);
      ASSERT_EQ(w.top_logprobs[t].size(), n);
      for (size_t j = 0; j < n; ++j) {
        EXPECT_NEAR(g.top_logprobs[t][j], w.top_logprobs[t][j], 1e-5);
        if (j > 0) {
          EXPECT_LE(w.top_logprobs[t][j], w.top_logprobs[t][j - 1]);
        }
        if (w.top_token_ids[t][j] == w.tokens[t]) {  // the sampled token's entry is its logprob
          EXPECT_EQ(w.top_logprobs[t][j], w.logprobs[t]) << "request " << i << " token " << t;
          EXPECT_EQ(g.top_logprobs[t][j], g.logprobs[t]) << "request " << i << " token " << t;
        }
      }
    }
    if (requests[i].sampling.temperature == 0 && n > 0) {
      for (size_t t = 0; t < w.tokens.size(); ++t) EXPECT_EQ(w.top_token_ids[t][0], w.tokens[t]);
    }
  }
  // The first token's entries against the float64 reference's last row.
  for (size_t i : {0, 1}) {
    const std::vector<float>& logits = ref.logits[i + 1];
    const float* row = logits.data() + logits.size() - vocab;
    double m = -INFINITY, sum = 0;
    for (int v = 0; v < vocab; ++v) m = std::max(m, double{row[v]});
    for (int v = 0; v < vocab; ++v) sum += std::exp(double{row[v]} - m);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    auto ref_logprob = [&](int32_t id) { return double{row[id]} - m - std::log(sum); };
    const GenerationResult& w = (*want)[i];
    for (size_t j = 0; j < w.top_token_ids[0].size(); ++j) {
      // Each entry's logprob is its token's, and the token ranks where the
      // reference ranks it (up to a near tie that fp32 may order otherwise).
      const int32_t id = w.top_token_ids[0][j];
      EXPECT_NEAR(w.top_logprobs[0][j], ref_logprob(id), 1e-3) << "request " << i << " entry " << j;
      EXPECT_NEAR(ref_logprob(id), ref_logprob(order[j]), 1e-3) << "request " << i << " entry " << j;
    }
  }
}

}  // namespace
}  // namespace chunkattn
