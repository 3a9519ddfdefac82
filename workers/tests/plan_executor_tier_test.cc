// PlanExecutor with KV tiers: a plan's moves run before its step, so chunks
// stored to the host and disk tiers, clobbered in the pool, and loaded back
// give the next decode step the logits it had before; moves that cannot be
// done (a wrong key, a slot never written or out of range, no tiers at all)
// are listed in failed_moves while the step itself succeeds; a move naming a
// chunk outside the pool is a malformed plan. Moves of chunks the step's
// forward pass leaves alone run beside it; others before it.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
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

// The tiny model, which once armed holds its chunk writes until a forward
// pass has begun and that pass until a write has been made (each at most
// `wait`): whether a load ran beside the pass, or before it, is then seen,
// not timed. Everything else is the model's own.
class GatedModel final : public Model {
 public:
  GatedModel(LlamaModel* model, absl::Duration wait) : model_(model), wait_(wait) {}

  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
  }
  // Per chunk write since Arm: whether a forward pass was running during it.
  std::vector<bool> writes() {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_;
  }

  const ModelConfig& config() const override { return model_->config(); }
  const ModelOptions& options() const override { return model_->options(); }
  std::string device() const override { return model_->device(); }
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>& logits) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (armed_) {
        in_forward_ = true;
        cv_.notify_all();
        cv_.wait_for(lock, absl::ToChronoNanoseconds(wait_), [&] { return !writes_.empty(); });
      }
    }
    absl::Status status = model_->Forward(batch, logits);
    std::lock_guard<std::mutex> lock(mu_);
    in_forward_ = false;
    return status;
  }
  absl::Status CopyKv(absl::Span<const KvCopy> copies) override { return model_->CopyKv(copies); }
  absl::Status ReadChunk(int32_t chunk, absl::Span<uint8_t> out) override { return model_->ReadChunk(chunk, out); }
  int64_t kv_chunk_bytes() const override { return model_->kv_chunk_bytes(); }
  absl::Status WriteChunk(int32_t chunk, absl::Span<const uint8_t> in) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (armed_) {
        writes_.push_back(cv_.wait_for(lock, absl::ToChronoNanoseconds(wait_), [&] { return in_forward_; }));
        cv_.notify_all();
      }
    }
    return model_->WriteChunk(chunk, in);
  }
  bool chunk_moves_beside_forward() const override { return model_->chunk_moves_beside_forward(); }

 private:
  LlamaModel* model_;
  const absl::Duration wait_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool in_forward_ = false;
  std::vector<bool> writes_;
};

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

// A load into a chunk the decode step does not touch runs beside its
// forward pass and lands whole; a load into a chunk the step reads, or one
// its copy writes, waits for nothing and runs first. The step's logits are those of the same steps
// without the moves, and the failed move is still reported.
TEST_F(PlanExecutorTiers, LoadsBesideTheForwardPassWhenItSkipsTheirChunks) {
  std::mt19937_64 rng(5);
  const StepPlan prefill = Prefill(rng);
  std::vector<float> want;
  {  // The same steps, no moves, on a model of its own.
    auto made = testing::MakeTinyModel();
    ASSERT_TRUE(made.ok()) << made.status();
    PlanExecutor plain(made->get(), /*samples=*/true);
    plain.set_keep_logits(true);
    StepResult result;
    ASSERT_TRUE(plain.Execute(prefill, &result).ok());
    ASSERT_TRUE(plain.Execute(Decode(2, true), &result).ok());
    ASSERT_TRUE(plain.Execute(Decode(3, false), &result).ok());
    want = plain.logits();
  }
  struct Case {
    const char* name;
    int32_t target;  // the load's pool chunk
    bool copy;       // the step copies chunk path_[0]'s first 3 tokens into the target
    bool beside;
  };
  for (const Case& c : {Case{"nobody's chunk", 40, false, true}, Case{"a chunk decode reads", path_[0], false, false},
                        Case{"a copy's target", 42, true, false}}) {
    SCOPED_TRACE(c.name);
    const bool beside = c.beside;
    auto made = testing::MakeTinyModel();
    ASSERT_TRUE(made.ok()) << made.status();
    // Beside: the write and the pass must meet (10 s is a hang, not a
    // pace); before: the write waits 0.3 s for a pass and must not see one.
    GatedModel gated(made->get(), beside ? absl::Seconds(10) : absl::Milliseconds(300));
    PlanExecutor executor(&gated, /*samples=*/true, tiers_.get());
    executor.set_keep_logits(true);
    StepResult result;
    ASSERT_TRUE(executor.Execute(prefill, &result).ok());
    StepPlan store;
    store.step = 2;
    store.moves = {KvMove::Store(KvTier::kHost, 0, path_[0], 0xCCCC)};
    ASSERT_TRUE(executor.Execute(store, &result).ok());
    ASSERT_TRUE(result.failed_moves.empty());
    ASSERT_TRUE(executor.Execute(Decode(3, true), &result).ok());
    const int32_t target = c.target;
    StepPlan step = Decode(4, false);
    if (c.copy) step.copies = {KvCopy{path_[0], target, 3}};
    step.moves = {KvMove::Load(KvTier::kHost, 0, target, 0xCCCC), KvMove::Load(KvTier::kHost, 0, 41, 0xDDDD)};
    const int64_t before = executor.moves_beside_forward();
    gated.Arm();
    ASSERT_TRUE(executor.Execute(step, &result).ok());
    EXPECT_EQ(result.failed_moves, std::vector<int32_t>{1});  // a wrong key
    EXPECT_EQ(executor.moves_beside_forward() - before, beside ? 1 : 0);
    EXPECT_EQ(gated.writes(), std::vector<bool>{beside});
    EXPECT_EQ(executor.logits(), want);
    std::vector<uint8_t> loaded(static_cast<size_t>(chunk_bytes_)), source(loaded.size());
    ASSERT_TRUE(gated.ReadChunk(target, absl::MakeSpan(loaded)).ok());
    ASSERT_TRUE(gated.ReadChunk(path_[0], absl::MakeSpan(source)).ok());
    EXPECT_EQ(loaded, source);
  }
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
