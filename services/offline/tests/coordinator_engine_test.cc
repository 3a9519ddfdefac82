// The coordinator's Engine (its loop thread, inbox, output thread and
// scheduler) on in-process workers: clients on many threads submit, cancel
// and read stats at once; a worker fails mid-step; a worker drains for a
// rolling update; the coordinator drains on SIGTERM. Greedy outputs must
// equal each request's run alone, every sink must finish exactly once and
// no chunk may stay in use. No gRPC in the process's hot paths, so this is
// the ThreadSanitizer test of the engine (label unit_tsan).
#include "services/coordinator/engine.h"

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/coordinator/worker_group.h"
#include "workers/server/plan_executor.h"
#include "workers/tests/tiny_model.h"

namespace chunkattn {
namespace {

using testing::kTinyChunks;

// Abseil's debug deadlock graph is shared by every Mutex in the process,
// gRPC's timer thread's included (linked in with the coordinator library),
// and guarded by a spin lock TSan cannot see: off, or TSan reports races
// inside it. TSan's own deadlock detector still checks lock order.
const bool kNoAbslDeadlockGraph = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

// One rank in this process. A Connect() is a fresh worker session: a new
// model, so a new, empty KV pool. The test's thread steers it through the
// atomics; the engine's loop thread is the only caller of the methods.
class InProcessWorkers final : public WorkerGroup {
 public:
  std::atomic<bool> fail_next_step{false};  // the next Step fails, as a dead worker's would
  std::atomic<bool> drain{false};           // step results say "shutting down" until released
  std::atomic<int> connects{0};
  std::atomic<int> releases{0};  // Disconnect() of a draining worker
  std::atomic<int> steps{0};

  absl::Status Connect() override {
    absl::StatusOr<std::unique_ptr<LlamaModel>> model = testing::MakeTinyModel();
    if (!model.ok()) return model.status();
    model_ = std::move(*model);
    executor_ = std::make_unique<PlanExecutor>(model_.get(), true);
    draining_.clear();
    ++connects;
    return absl::OkStatus();
  }
  void Disconnect() override {
    if (drain.exchange(false)) ++releases;  // the worker exits; its replacement comes up
    executor_.reset();
    model_.reset();
  }
  absl::Status Probe() override {
    return drain ? absl::UnavailableError("worker in-process is shutting down") : absl::OkStatus();
  }
  absl::StatusOr<StepResult> Step(StepPlan* step, const std::function<void(StepPlan*)>& fill_masks) override {
    ++steps;
    if (step->masks_follow) fill_masks(step);  // in process: no forward pass to overlap
    const StepPlan& plan = *step;
    if (executor_ == nullptr) return absl::UnavailableError("not connected");
    if (fail_next_step.exchange(false)) {
      Disconnect();
      return absl::UnavailableError("worker in-process failed: killed by the test");
    }
    StepResult result;
    if (absl::Status s = executor_->Execute(plan, &result); !s.ok()) {
      Disconnect();
      return absl::UnavailableError(s.message());
    }
    if (drain) draining_ = "in-process";
    return result;
  }
  const std::string& draining() const override { return draining_; }
  int world_size() const override { return 1; }
  int64_t num_chunks() const override { return kTinyChunks; }
  int64_t chunk_bytes_total() const override { return 1; }
  const std::string& dtype() const override { return name_; }
  const std::string& device() const override { return name_; }
  const std::string& kv_dtype() const override { return name_; }

 private:
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<PlanExecutor> executor_;
  std::string draining_;
  const std::string name_ = "in-process";
};

// Records what the engine sends one request, from the output thread.
class RecordingSink final : public ResponseSink {
 public:
  void Send(GenerationOutput output) override {
    absl::MutexLock lock(&mu_);
    auto& tokens = tokens_[static_cast<uint32_t>(output.index)];
    tokens.insert(tokens.end(), output.token_ids.begin(), output.token_ids.end());
    if (output.finish_reason != FinishReason::kNone) ++finished_samples_;
  }
  void Finish(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    ++finishes_;
    status_ = std::move(status);
  }

  // Waits for Finish(); false on timeout.
  bool Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finishes_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  int finishes() {
    absl::MutexLock lock(&mu_);
    return finishes_;
  }
  int finished_samples() {
    absl::MutexLock lock(&mu_);
    return finished_samples_;
  }
  std::map<uint32_t, std::vector<int32_t>> tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  int64_t total_tokens() {
    absl::MutexLock lock(&mu_);
    int64_t n = 0;
    for (const auto& [index, t] : tokens_) n += static_cast<int64_t>(t.size());
    return n;
  }

 private:
  absl::Mutex mu_;
  std::map<uint32_t, std::vector<int32_t>> tokens_ ABSL_GUARDED_BY(mu_);
  int finished_samples_ ABSL_GUARDED_BY(mu_) = 0;
  int finishes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

constexpr absl::Duration kWait = absl::Seconds(120);  // a hang, not a slow run (TSan is slow)

class CoordinatorEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto workers = std::make_unique<InProcessWorkers>();
    workers_ = workers.get();
    EngineOptions options;
    options.scheduler.chunk_size = testing::kTinyChunkSize;
    options.scheduler.max_context = testing::TinyConfig().max_context;
    options.scheduler.max_batch_size = 16;
    options.scheduler.max_tokens_per_step = 256;
    options.scheduler.eos_token_ids = testing::TinyConfig().eos_token_ids;
    options.reconnect_interval = absl::Milliseconds(10);
    config_ = testing::TinyConfig();
    engine_ = std::make_unique<Engine>(options, &config_, nullptr, &metrics_, std::move(workers));
    engine_->Start();
    WaitReady();
  }
  void TearDown() override { engine_.reset(); }

  void WaitReady() {
    const absl::Time deadline = absl::Now() + kWait;
    while (!engine_->ready() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    ASSERT_TRUE(engine_->ready());
  }

  // Greedy, EOS ignored: each sample runs for exactly max_new_tokens.
  static EngineRequest MakeRequest(std::mt19937* rng, int max_new) {
    static const std::vector<std::vector<int32_t>> kSystems = [] {
      std::mt19937 r(5);
      std::vector<std::vector<int32_t>> s(3);
      for (auto& p : s) {
        p.resize(20 + r() % 30);
        for (auto& t : p) t = static_cast<int32_t>(r() % 96);
      }
      return s;
    }();
    EngineRequest req;
    req.spec.prompt = kSystems[(*rng)() % kSystems.size()];
    const int suffix = 1 + static_cast<int>((*rng)() % 20);
    for (int k = 0; k < suffix; ++k) req.spec.prompt.push_back(static_cast<int32_t>((*rng)() % 96));
    req.spec.sampling.temperature = 0;
    req.spec.max_new_tokens = 1 + static_cast<int>((*rng)() % max_new);
    req.spec.n = (*rng)() % 4 == 0 ? 2 : 1;
    req.spec.ignore_eos = true;
    return req;
  }

  std::shared_ptr<RecordingSink> Submit(const EngineRequest& request, int64_t* id = nullptr) {
    auto sink = std::make_shared<RecordingSink>();
    const int64_t got = engine_->Submit(request, sink);
    if (id != nullptr) *id = got;
    return sink;
  }

  // What the request generates alone (the engine otherwise idle).
  std::map<uint32_t, std::vector<int32_t>> Alone(const EngineRequest& request) {
    auto sink = Submit(request);
    EXPECT_TRUE(sink->Wait(kWait));
    EXPECT_TRUE(sink->status().ok()) << sink->status();
    return sink->tokens();
  }

  // Every sample complete and equal to the request's run alone.
  static void ExpectComplete(RecordingSink& sink, const EngineRequest& request,
                             const std::map<uint32_t, std::vector<int32_t>>& alone, const std::string& what) {
    ASSERT_TRUE(sink.status().ok()) << what << ": " << sink.status();
    EXPECT_EQ(sink.finished_samples(), request.spec.n) << what;
    EXPECT_EQ(sink.tokens(), alone) << what;
    for (const auto& [index, tokens] : alone) {
      EXPECT_EQ(static_cast<int>(tokens.size()), request.spec.max_new_tokens) << what;
    }
  }

  // The loop has updated its stats after the last step: nothing in use.
  void ExpectQuiet() {
    const absl::Time deadline = absl::Now() + kWait;
    Engine::Snapshot s;
    do {
      s = engine_->snapshot();
      if (s.cache.used_chunks == 0 && s.scheduler.running_requests == 0 && s.scheduler.waiting_requests == 0) break;
      absl::SleepFor(absl::Milliseconds(5));
    } while (absl::Now() < deadline);
    EXPECT_EQ(s.cache.used_chunks, 0);
    EXPECT_EQ(s.scheduler.running_requests, 0);
    EXPECT_EQ(s.scheduler.waiting_requests, 0);
    EXPECT_EQ(s.cache.used_chunks + s.cache.cached_chunks + s.cache.free_chunks, kTinyChunks);
  }

  ModelConfig config_;
  metrics::Registry metrics_;
  InProcessWorkers* workers_ = nullptr;  // owned by the engine
  std::unique_ptr<Engine> engine_;
};

TEST_F(CoordinatorEngineTest, ClientsOnManyThreadsSubmitCancelAndReadStats) {
  constexpr int kThreads = 4, kPerThread = 12;
  std::mt19937 rng(17);
  std::vector<std::vector<EngineRequest>> requests(kThreads);
  std::vector<std::vector<std::map<uint32_t, std::vector<int32_t>>>> alone(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < kPerThread; ++k) {
      requests[t].push_back(MakeRequest(&rng, 24));
      alone[t].push_back(Alone(requests[t].back()));
    }
  }
  ExpectQuiet();

  std::atomic<bool> clients_done{false};
  std::thread stats([&] {  // a metrics scrape and a benchmark's peak reset, all the while
    while (!clients_done) {
      const Engine::Snapshot s = engine_->snapshot();
      EXPECT_LE(s.cache.used_chunks, kTinyChunks);
      engine_->ResetPeaks();
      absl::SleepFor(absl::Microseconds(300));
    }
  });
  std::vector<std::vector<std::shared_ptr<RecordingSink>>> sinks(kThreads);
  std::vector<std::vector<bool>> cancelled(kThreads);
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 r(100 + t);
      for (const EngineRequest& req : requests[t]) {
        int64_t id = 0;
        sinks[t].push_back(Submit(req, &id));
        const bool cancel = r() % 4 == 0;
        cancelled[t].push_back(cancel);
        if (cancel) {
          absl::SleepFor(absl::Microseconds(r() % 3000));
          engine_->Cancel(id);
        }
      }
      for (auto& sink : sinks[t]) EXPECT_TRUE(sink->Wait(kWait));
    });
  }
  for (auto& c : clients) c.join();
  clients_done = true;
  stats.join();

  int completed = 0, cut = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < kPerThread; ++k) {
      RecordingSink& sink = *sinks[t][k];
      const std::string what = "client " + std::to_string(t) + " request " + std::to_string(k);
      if (cancelled[t][k] && !sink.status().ok()) {
        EXPECT_TRUE(absl::IsCancelled(sink.status())) << what << ": " << sink.status();
        // What it got before the cancel is a prefix of its run alone.
        for (const auto& [index, tokens] : sink.tokens()) {
          const auto& ref = alone[t][k].at(index);
          ASSERT_LE(tokens.size(), ref.size()) << what;
          EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), ref.begin())) << what;
        }
        ++cut;
        continue;
      }
      ExpectComplete(sink, requests[t][k], alone[t][k], what);
      ++completed;
    }
  }
  EXPECT_GT(completed, kThreads * kPerThread / 2);
  EXPECT_GT(cut, 0);
  ExpectQuiet();
  engine_.reset();  // Stop(): nothing may finish twice
  for (auto& per_thread : sinks) {
    for (auto& sink : per_thread) EXPECT_EQ(sink->finishes(), 1);
  }
}

TEST_F(CoordinatorEngineTest, AFailedStepEndsWhatRanAndTheEngineRecovers) {
  std::mt19937 rng(23);
  const EngineRequest probe = MakeRequest(&rng, 8);
  const auto probe_alone = Alone(probe);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int k = 0; k < 6; ++k) {
    EngineRequest req = MakeRequest(&rng, 8);
    req.spec.max_new_tokens = 300;  // still running when the worker fails
    sinks.push_back(Submit(req));
  }
  const absl::Time deadline = absl::Now() + kWait;
  while (sinks[0]->total_tokens() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  workers_->fail_next_step = true;
  for (auto& sink : sinks) {
    ASSERT_TRUE(sink->Wait(kWait));
    EXPECT_TRUE(absl::IsUnavailable(sink->status())) << sink->status();
    EXPECT_NE(sink->status().message().find("killed by the test"), std::string::npos) << sink->status();
  }
  // The sinks may hear of the failure before the loop turns not ready.
  while (workers_->connects < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  WaitReady();
  EXPECT_EQ(workers_->connects, 2);
  auto again = Submit(probe);
  ASSERT_TRUE(again->Wait(kWait));
  ExpectComplete(*again, probe, probe_alone, "after the failure");
  ExpectQuiet();
}

TEST_F(CoordinatorEngineTest, ADrainingWorkerLosesNoRequest) {
  std::mt19937 rng(29);
  std::vector<EngineRequest> requests;
  std::vector<std::map<uint32_t, std::vector<int32_t>>> alone;
  for (int k = 0; k < 12; ++k) {
    requests.push_back(MakeRequest(&rng, 8));
    requests.back().spec.max_new_tokens = 20 + k * 5;
    alone.push_back(Alone(requests.back()));
  }
  // Six running, then the worker gets SIGTERM, then six more arrive.
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int k = 0; k < 6; ++k) sinks.push_back(Submit(requests[k]));
  const absl::Time deadline = absl::Now() + kWait;
  while (sinks[0]->total_tokens() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  workers_->drain = true;
  while (workers_->releases == 0 && engine_->ready() && absl::Now() < deadline) {
    if (sinks.size() < requests.size()) sinks.push_back(Submit(requests[sinks.size()]));
    absl::SleepFor(absl::Milliseconds(1));
  }
  // Sent after the release may be refused (the workers are away); resend
  // those once the engine is back, as a client would.
  while (sinks.size() < requests.size()) sinks.push_back(Submit(requests[sinks.size()]));
  for (size_t k = 0; k < sinks.size(); ++k) {
    ASSERT_TRUE(sinks[k]->Wait(kWait));
    if (absl::IsUnavailable(sinks[k]->status()) &&
        sinks[k]->status().message().find("not ready") != std::string::npos) {
      WaitReady();
      sinks[k] = Submit(requests[k]);
      ASSERT_TRUE(sinks[k]->Wait(kWait));
    }
    ExpectComplete(*sinks[k], requests[k], alone[k], "request " + std::to_string(k));
  }
  EXPECT_EQ(workers_->releases, 1);
  EXPECT_EQ(workers_->connects, 2);  // re-joined once, not failed
  ExpectQuiet();
}

TEST_F(CoordinatorEngineTest, DrainFinishesTheRunningAndRefusesTheNew) {
  std::mt19937 rng(31);
  std::vector<EngineRequest> requests;
  std::vector<std::map<uint32_t, std::vector<int32_t>>> alone;
  for (int k = 0; k < 4; ++k) {
    requests.push_back(MakeRequest(&rng, 8));
    requests.back().spec.max_new_tokens = 60;
    alone.push_back(Alone(requests.back()));
  }
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& req : requests) sinks.push_back(Submit(req));
  std::thread late([&] {  // a client racing the drain: it runs or is refused, never lost
    absl::SleepFor(absl::Milliseconds(2));
    auto sink = Submit(requests[0]);
    ASSERT_TRUE(sink->Wait(kWait));
    if (!sink->status().ok()) {
      EXPECT_TRUE(absl::IsUnavailable(sink->status())) << sink->status();
    } else {
      ExpectComplete(*sink, requests[0], alone[0], "the racing request");
    }
  });
  EXPECT_TRUE(engine_->Drain(kWait));
  late.join();
  for (size_t k = 0; k < sinks.size(); ++k) {
    ASSERT_TRUE(sinks[k]->Wait(absl::ZeroDuration()));
    ExpectComplete(*sinks[k], requests[k], alone[k], "request " + std::to_string(k));
  }
  auto refused = Submit(requests[1]);
  ASSERT_TRUE(refused->Wait(kWait));
  EXPECT_TRUE(absl::IsUnavailable(refused->status())) << refused->status();
  engine_->Stop();
  auto after_stop = Submit(requests[1]);
  ASSERT_TRUE(after_stop->Wait(kWait));
  EXPECT_TRUE(absl::IsUnavailable(after_stop->status()));
}

}  // namespace
}  // namespace chunkattn
