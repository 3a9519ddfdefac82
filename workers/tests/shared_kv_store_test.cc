// The shared KV tier on a worker against a redis-server of the test's own:
// values round-trip; a value that is missing, cut short, another block's or
// corrupt fails its load (and leaves the pool chunk as it was); a Redis that
// is down or gone mid-run fails moves, never a step; the executor's shared
// moves give the next decode the logits it had before; keys name the model,
// the shard and the geometry.
#include "workers/server/shared_kv_store.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "base/tests/redis_server.h"
#include "gtest/gtest.h"
#include "workers/server/plan_executor.h"
#include "workers/tests/tiny_model.h"
#include "workers/tests/tiny_prompt_plans.h"
#include "workers/tests/random_bytes.h"

namespace chunkattn {
namespace {

class SharedKvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start()) << "cannot start redis-server (scripts/install-deps.sh installs it)";
  }
  std::unique_ptr<SharedKvStore> Make(int64_t chunk_bytes, int64_t max_queued = int64_t{64} << 20) {
    SharedKvOptions o;
    o.url = server_.url();
    o.max_queued_bytes = max_queued;
    return std::make_unique<SharedKvStore>(o, "chunkattn:kv:v2:test:r0of1:", chunk_bytes);
  }
  RedisServerForTest server_{"secret"};
};

TEST_F(SharedKvStoreTest, RoundTripAndEveryCheck) {
  std::mt19937_64 rng(1);
  constexpr int64_t kBytes = 1000;
  auto store = Make(kBytes);
  const std::vector<uint8_t> a = RandomBytes(rng, kBytes);
  ASSERT_TRUE(store->Store(0xA, a).ok());
  store->Flush();
  EXPECT_EQ(store->stats().stored, 1);
  std::vector<uint8_t> out(kBytes);
  ASSERT_TRUE(store->Load(0xA, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, a);
  EXPECT_TRUE(absl::IsNotFound(store->Load(0xB, absl::MakeSpan(out))));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Store(0xA, absl::MakeConstSpan(a).first(10))));

  // Values written behind the store's back: each check fails its load.
  RedisClient client(server_.url(), RedisOptions());
  absl::StatusOr<std::optional<std::string>> value = client.Get(store->RedisKey(0xA), 1 << 20);
  ASSERT_TRUE(value.ok() && value->has_value());
  const std::string good = **value;
  auto expect_loss = [&](const std::string& bad, const char* what) {
    ASSERT_TRUE(client.Set(store->RedisKey(0xC), bad, absl::ZeroDuration()).ok());
    std::vector<uint8_t> kept(kBytes, 7);
    const absl::Status s = store->Load(0xC, absl::MakeSpan(kept));
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.code(), absl::StatusCode::kOk) << what;
  };
  expect_loss(good, "another block's value (key 0xA's under 0xC)");
  std::string flipped = good;
  flipped[SharedKvStore::kHeaderBytes + 500] ^= 0x10;
  ASSERT_TRUE(client.Set(store->RedisKey(0xA), flipped, absl::ZeroDuration()).ok());
  EXPECT_TRUE(absl::IsDataLoss(store->Load(0xA, absl::MakeSpan(out))));
  expect_loss(good.substr(0, good.size() - 1), "cut short");
  expect_loss(good + "x", "one byte too many");
  expect_loss("", "empty");
  expect_loss(std::string(good.size(), '\0'), "zeros");
  // A value far over a chunk's size is refused without being read whole.
  expect_loss(std::string(4 << 20, 'x'), "huge");
  // The store still serves after all that.
  ASSERT_TRUE(store->Store(0xD, a).ok());
  store->Flush();
  ASSERT_TRUE(store->Load(0xD, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, a);
}

TEST_F(SharedKvStoreTest, FullQueueDropsTheStore) {
  std::mt19937_64 rng(2);
  auto store = Make(1000, /*max_queued=*/1500);
  const std::vector<uint8_t> a = RandomBytes(rng, 1000);
  server_.Kill();  // the writer stalls on a dead server at most its back-off; fill the queue meanwhile
  int dropped = 0;
  for (int i = 0; i < 50; ++i) dropped += absl::IsResourceExhausted(store->Store(i, a)) ? 1 : 0;
  EXPECT_GT(dropped, 0);
  store->Flush();
  EXPECT_EQ(store->stats().stored, 0);
  EXPECT_GT(store->stats().store_failed, 0);
}

TEST_F(SharedKvStoreTest, DownRedisFailsFast) {
  std::mt19937_64 rng(3);
  auto store = Make(1000);
  server_.Kill();
  std::vector<uint8_t> out(1000);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(store->Load(i, absl::MakeSpan(out)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(store->Store(1, RandomBytes(rng, 1000)).ok());  // queued; the writer fails it
  store->Flush();
  EXPECT_EQ(store->stats().store_failed, 1);
}

TEST(SharedKvKeyPrefixTest, NamesModelShardAndGeometry) {
  auto made = testing::MakeTinyModel();
  ASSERT_TRUE(made.ok()) << made.status();
  const ModelConfig config = (*made)->config();
  absl::StatusOr<ModelWeights> w = DummyWeights(config, {0, 1}, 5);
  absl::StatusOr<ModelWeights> other = DummyWeights(config, {0, 1}, 6);
  ASSERT_TRUE(w.ok() && other.ok());
  ModelOptions mo;
  mo.chunk_size = 16;
  const std::string base = SharedKvKeyPrefix(config, *w, mo, "cpu", 0, 1);
  EXPECT_EQ(base, SharedKvKeyPrefix(config, *w, mo, "cpu", 0, 1));
  EXPECT_EQ(base.rfind("chunkattn:kv:v2:", 0), 0u);
  EXPECT_NE(base, SharedKvKeyPrefix(config, *other, mo, "cpu", 0, 1));  // other weights
  EXPECT_NE(base, SharedKvKeyPrefix(config, *w, mo, "cuda", 0, 1));
  EXPECT_NE(base, SharedKvKeyPrefix(config, *w, mo, "cpu", 1, 2));
  ModelOptions half = mo;
  half.kv_dtype = DType::kFloat16;
  EXPECT_NE(base, SharedKvKeyPrefix(config, *w, half, "cpu", 0, 1));
  ModelOptions chunk = mo;
  chunk.chunk_size = 32;
  EXPECT_NE(base, SharedKvKeyPrefix(config, *w, chunk, "cpu", 0, 1));
}

// The executor's shared moves on the tiny model: stored chunks, clobbered in
// the pool, load back and decode as before; a missing block or a dead Redis
// fails its move, never the step.
class PlanExecutorShared : public SharedKvStoreTest {
 protected:
  void SetUp() override {
    SharedKvStoreTest::SetUp();
    auto made = testing::MakeTinyModel();
    ASSERT_TRUE(made.ok()) << made.status();
    model_ = std::move(*made);
    chunk_bytes_ = KvShapeOf(model_->config(), model_->layout(), model_->options()).BytesPerChunk();
    shared_ = Make(chunk_bytes_);
  }
  StepPlan Decode(uint64_t step, bool with_context) const {
    return testing::TinyPromptDecode(step, path_, with_context);
  }
  const std::vector<int32_t> path_ = {12, 30, 5};
  std::unique_ptr<LlamaModel> model_;
  int64_t chunk_bytes_ = 0;
  std::unique_ptr<SharedKvStore> shared_;
};

TEST_F(PlanExecutorShared, StoredChunksLoadBackAndDecodeAsBefore) {
  std::mt19937_64 rng(4);
  PlanExecutor executor(model_.get(), /*samples=*/true, nullptr, shared_.get());
  executor.set_keep_logits(true);
  StepResult result;
  ASSERT_TRUE(executor.Execute(testing::TinyPromptPrefill(rng, path_), &result).ok());
  ASSERT_TRUE(executor.Execute(Decode(2, true), &result).ok());
  const std::vector<float> before = executor.logits();

  StepPlan store;
  store.step = 3;
  store.moves = {KvMove::Store(KvTier::kShared, 0, path_[0], 0xAAAA), KvMove::Store(KvTier::kShared, 0, path_[1], 0xBBBB)};
  ASSERT_TRUE(executor.Execute(store, &result).ok());
  EXPECT_TRUE(result.failed_moves.empty());
  shared_->Flush();

  std::vector<uint8_t> noise(static_cast<size_t>(chunk_bytes_), 0x3c);
  ASSERT_TRUE(model_->WriteChunk(path_[0], noise).ok());
  ASSERT_TRUE(model_->WriteChunk(path_[1], noise).ok());
  ASSERT_TRUE(executor.Execute(Decode(4, false), &result).ok());
  EXPECT_NE(executor.logits(), before);

  StepPlan load = Decode(5, false);
  load.moves = {KvMove::Load(KvTier::kShared, 0, path_[0], 0xAAAA), KvMove::Load(KvTier::kShared, 0, 50, 0xCCCC),
                KvMove::Load(KvTier::kShared, 0, path_[1], 0xBBBB)};
  ASSERT_TRUE(executor.Execute(load, &result).ok());
  EXPECT_EQ(result.failed_moves, std::vector<int32_t>{1});
  EXPECT_EQ(executor.logits(), before);
  EXPECT_GT(result.shared_load_seconds, 0);

  // Redis gone: the moves fail, the steps run.
  server_.Kill();
  StepPlan again = Decode(6, false);
  again.moves = {KvMove::Load(KvTier::kShared, 0, path_[2], 0xAAAA), KvMove::Store(KvTier::kShared, 0, path_[0], 1)};
  std::vector<uint8_t> kept(static_cast<size_t>(chunk_bytes_)), now(kept.size());
  ASSERT_TRUE(model_->ReadChunk(path_[2], absl::MakeSpan(kept)).ok());
  ASSERT_TRUE(executor.Execute(again, &result).ok());
  EXPECT_EQ(result.failed_moves, std::vector<int32_t>{0});  // the store is queued, then dropped by the writer
  ASSERT_TRUE(model_->ReadChunk(path_[2], absl::MakeSpan(now)).ok());
  EXPECT_EQ(now, kept);

  // A demote from the shared tier is a malformed plan; without a shared
  // store its moves fail.
  StepPlan demote;
  demote.moves = {KvMove{KvMove::Kind::kDemote, KvTier::kShared, 0, 0, -1, 1}};
  EXPECT_TRUE(absl::IsInvalidArgument(executor.Execute(demote, &result)));
  PlanExecutor bare(model_.get(), /*samples=*/false);
  StepPlan plan;
  plan.moves = {KvMove::Load(KvTier::kShared, 0, 3, 1)};
  ASSERT_TRUE(bare.Execute(plan, &result).ok());
  EXPECT_EQ(result.failed_moves, std::vector<int32_t>{0});
}

}  // namespace
}  // namespace chunkattn
