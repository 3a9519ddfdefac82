// PlanExecutor with KV tiers: a plan's moves run before its step, so chunks
// stored to the host and disk tiers, clobbered in the pool, and loaded back
// give the next decode step the logits it had before; moves that cannot be
// done (a wrong key, a slot never written or out of range, no tiers at all)
// are listed in failed_moves while the step itself succeeds; a move naming a
// chunk outside the pool is a malformed plan.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "workers/server/kv_tier_store.h"
#include "workers/server/plan_executor.h"
#include "base/tests/temp_dir.h"
#include "workers/tests/tiny_model.h"
#include "workers/tests/tiny_prompt_plans.h"

namespace chunkattn {
namespace {

class PlanExecutorTiers : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = testing::MakeTinyModel();
    ASSERT_TRUE(made.ok()) << made.status();
    model_ = std::move(*made);
    chunk_bytes_ = KvShapeOf(model_->config(), model_->layout(), model_->options()).BytesPerChunk();
    ASSERT_FALSE(dir_.empty());
    KvTierOptions options;
    options.host_bytes = 4 * (KvTierStore::kHeaderBytes + chunk_bytes_);
    options.disk_dir = dir_;
    options.disk_bytes = 4 * (KvTierStore::kHeaderBytes + chunk_bytes_);
    auto tiers = KvTierStore::Create(options, chunk_bytes_);
    ASSERT_TRUE(tiers.ok()) << tiers.status();
    tiers_ = std::move(*tiers);
  }

  StepPlan Prefill(std::mt19937_64& rng) const { return testing::TinyPromptPrefill(rng, path_); }
  StepPlan Decode(uint64_t step, bool with_context) const {
    return testing::TinyPromptDecode(step, path_, with_context);
  }

  const std::vector<int32_t> path_ = {12, 30, 5};
  const std::string dir_ = testing::MakeTempDir("plan-tier-test");
  std::unique_ptr<LlamaModel> model_;
  int64_t chunk_bytes_ = 0;
  std::unique_ptr<KvTierStore> tiers_;
};

TEST_F(PlanExecutorTiers, StoredChunksLoadBackAndDecodeAsBefore) {
  std::mt19937_64 rng(3);
  PlanExecutor executor(model_.get(), /*samples=*/true, tiers_.get());
  executor.set_keep_logits(true);
  StepResult result;
  ASSERT_TRUE(executor.Execute(Prefill(rng), &result).ok());
  ASSERT_TRUE(executor.Execute(Decode(2, true), &result).ok());
  const std::vector<float> before = executor.logits();

  // Chunk 12 to host slot 1 then down to disk slot 3; chunk 30 to disk slot
  // 0. A step of moves only.
  StepPlan moves;
  moves.step = 3;
  moves.moves = {KvMove::Store(KvTier::kHost, 1, path_[0], 0xAAAA),
                 KvMove::Demote(1, /*disk_slot=*/3, 0),
                 KvMove::Store(KvTier::kDisk, 0, path_[1], 0xBBBB)};
  ASSERT_TRUE(executor.Execute(moves, &result).ok());
  EXPECT_TRUE(result.failed_moves.empty());

  // The pool's chunks reused for something else meanwhile.
  std::vector<uint8_t> noise(static_cast<size_t>(chunk_bytes_));
  for (size_t i = 0; i + 4 <= noise.size(); i += 4) {
    const float f = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 300;
    std::memcpy(noise.data() + i, &f, 4);
  }
  ASSERT_TRUE(model_->WriteChunk(path_[0], noise).ok());
  ASSERT_TRUE(model_->WriteChunk(path_[1], noise).ok());
  ASSERT_TRUE(executor.Execute(Decode(4, false), &result).ok());
  EXPECT_NE(executor.logits(), before);

  // Loaded back before the step's decode, with failing moves among them:
  // a wrong key (1), a slot never written (2), a slot the tier lacks (4).
  StepPlan load = Decode(5, false);
  load.moves = {KvMove::Load(KvTier::kDisk, 3, path_[0], 0xAAAA),
                KvMove::Load(KvTier::kDisk, 0, 50, 0xAAAA),
                KvMove::Load(KvTier::kHost, 2, 51, 0xAAAA),
                KvMove::Load(KvTier::kDisk, 0, path_[1], 0xBBBB),
                KvMove::Store(KvTier::kHost, 4, path_[2], 1)};
  ASSERT_TRUE(executor.Execute(load, &result).ok());
  EXPECT_EQ(result.failed_moves, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(executor.logits(), before);
  // The host slot still holds chunk 12 (a demote copies).
  std::vector<uint8_t> bytes(static_cast<size_t>(chunk_bytes_)), pool(bytes.size());
  ASSERT_TRUE(tiers_->Load(KvTier::kHost, 1, 0xAAAA, absl::MakeSpan(bytes)).ok());
  ASSERT_TRUE(model_->ReadChunk(path_[0], absl::MakeSpan(pool)).ok());
  EXPECT_EQ(bytes, pool);
}

// A corrupt slot fails its load and leaves the pool chunk as it was.
TEST_F(PlanExecutorTiers, CorruptLoadFailsAndLeavesTheChunk) {
  std::mt19937_64 rng(4);
  PlanExecutor executor(model_.get(), /*samples=*/false, tiers_.get());
  StepResult result;
  ASSERT_TRUE(executor.Execute(Prefill(rng), &result).ok());
  StepPlan store;
  store.step = 2;
  store.moves = {KvMove::Store(KvTier::kDisk, 2, path_[0], 77)};
  ASSERT_TRUE(executor.Execute(store, &result).ok());
  ASSERT_TRUE(result.failed_moves.empty());
  {  // one byte of the stored chunk flipped on disk
    FILE* f = std::fopen(tiers_->disk_path().c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    const long at = static_cast<long>(2 * (KvTierStore::kHeaderBytes + chunk_bytes_) + KvTierStore::kHeaderBytes + 100);
    ASSERT_EQ(std::fseek(f, at, SEEK_SET), 0);
    const int b = std::fgetc(f);
    ASSERT_EQ(std::fseek(f, at, SEEK_SET), 0);
    std::fputc(b ^ 0x10, f);
    std::fclose(f);
  }
  std::vector<uint8_t> kept(static_cast<size_t>(chunk_bytes_)), now(kept.size());
  ASSERT_TRUE(model_->ReadChunk(path_[2], absl::MakeSpan(kept)).ok());
  StepPlan load;
  load.step = 3;
  load.moves = {KvMove::Load(KvTier::kDisk, 2, path_[2], 77)};
  ASSERT_TRUE(executor.Execute(load, &result).ok());
  EXPECT_EQ(result.failed_moves, std::vector<int32_t>{0});
  ASSERT_TRUE(model_->ReadChunk(path_[2], absl::MakeSpan(now)).ok());
  EXPECT_EQ(now, kept);
}

TEST_F(PlanExecutorTiers, WithoutTiersEveryMoveFails) {
  PlanExecutor executor(model_.get(), /*samples=*/false);
  StepPlan plan;
  plan.step = 1;
  plan.moves = {KvMove::Store(KvTier::kHost, 0, 3, 1), KvMove::Load(KvTier::kDisk, 0, 3, 1),
                KvMove::Demote(0, 0, 0)};
  StepResult result;
  result.failed_moves = {9};  // overwritten
  ASSERT_TRUE(executor.Execute(plan, &result).ok());
  EXPECT_EQ(result.failed_moves, (std::vector<int32_t>{0, 1, 2}));
}

// A move naming a chunk the pool lacks is the coordinator's bug, not a tier
// miss: the plan is refused before any of its moves runs.
TEST_F(PlanExecutorTiers, MovesOutsideThePoolAreMalformed) {
  PlanExecutor executor(model_.get(), /*samples=*/false, tiers_.get());
  StepResult result;
  for (int32_t chunk : {-1, testing::kTinyChunks}) {
    StepPlan plan;
    plan.step = 1;
    plan.moves = {KvMove::Store(KvTier::kHost, 0, 3, 5),
                  KvMove::Load(KvTier::kHost, 1, chunk, 5)};
    EXPECT_EQ(executor.Execute(plan, &result).code(), absl::StatusCode::kInvalidArgument);
    std::vector<uint8_t> bytes(static_cast<size_t>(chunk_bytes_));
    EXPECT_EQ(tiers_->Load(KvTier::kHost, 0, 5, absl::MakeSpan(bytes)).code(), absl::StatusCode::kNotFound);
  }
  StepPlan negative_slot;
  negative_slot.moves = {KvMove::Store(KvTier::kHost, -1, 3, 5)};
  EXPECT_EQ(executor.Execute(negative_slot, &result).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn
