#include "services/coordinator/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/grpc_status.h"
#include "base/status_macros.h"
#include "grpcpp/create_channel.h"
#include "proto/plan/plan_proto.h"

namespace chunkattn {

using WirePlan = internal::v1::StepPlan;
using WireResult = internal::v1::StepResult;

struct WorkerPool::Rank {
  std::string address;
  std::unique_ptr<internal::v1::Worker::Stub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReaderWriter<WirePlan, WireResult>> stream;
  WireResult result;
  absl::Status status;
  grpc::Status ended;  // the stream's own final status once it failed (stream then null)
};

namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace

WorkerPool::WorkerPool(WorkerPoolOptions options) : options_(std::move(options)) {
  if (options_.coordinator_id.empty()) {
    std::mt19937_64 rng(std::random_device{}());
    options_.coordinator_id = absl::StrFormat("c%016x%016x", rng(), rng());
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // Notice a silent peer (a node gone without closing its sockets).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly once a restarted worker is back.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  options_.channel.Apply(&args);
  for (const std::string& address : options_.addresses) {
    auto rank = std::make_unique<Rank>();
    rank->address = address;
    rank->stub = internal::v1::Worker::NewStub(
        grpc::CreateCustomChannel(address, options_.channel.credentials, args));
    ranks_.push_back(std::move(rank));
  }
  if (options_.step_timeout != absl::InfiniteDuration() || options_.adaptive_step_timeout) {
    watchdog_ = std::thread(&WorkerPool::Watchdog, this);
  }
}

absl::Duration AdaptiveStepTimeout(const std::deque<absl::Duration>& recent) {
  if (recent.size() < kStepHistory / 8) return absl::Seconds(60);
  const absl::Duration slowest = *std::max_element(recent.begin(), recent.end());
  return std::clamp(20 * slowest, absl::Seconds(5), absl::Seconds(120));
}

WorkerPool::~WorkerPool() {
  Disconnect();
  if (watchdog_.joinable()) {
    {
      absl::MutexLock lock(&watch_mu_);
      stop_watchdog_ = true;
    }
    watchdog_.join();
  }
}

void WorkerPool::Watchdog() {
  // Polls at a tenth of the timeout (at most 100 ms): a step is noticed
  // overdue within timeout + 100 ms.
  const absl::Duration poll = options_.adaptive_step_timeout
                                  ? absl::Milliseconds(100)
                                  : std::min(options_.step_timeout / 10, absl::Milliseconds(100));
  absl::MutexLock lock(&watch_mu_);
  while (!stop_watchdog_) {
    auto stopping = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_watchdog_; };
    watch_mu_.AwaitWithTimeout(absl::Condition(&stopping), poll);
    if (stop_watchdog_ || absl::Now() - step_started_ < step_timeout_) continue;
    step_timed_out_ = true;
    for (auto& r : ranks_) {
      if (r->context != nullptr) r->context->TryCancel();
    }
    step_started_ = absl::InfiniteFuture();  // once per step
  }
}

void WorkerPool::StartStreamThreads() {
  if (ranks_.size() < 2) return;  // one rank runs on the loop thread
  uint64_t seen;
  {
    absl::MutexLock lock(&step_mu_);
    stop_threads_ = false;
    // Read here, not in the threads: a Step() that comes before a new thread
    // first runs (requests queued while the workers were away) must still be
    // one it waits for, or that step never completes (found by bench/soak.py).
    seen = step_seq_;
  }
  for (auto& rank : ranks_) stream_threads_.emplace_back(&WorkerPool::StreamLoop, this, rank.get(), seen);
}

void WorkerPool::StopStreamThreads() {
  {
    absl::MutexLock lock(&step_mu_);
    stop_threads_ = true;
  }
  // Between steps every thread waits for the next one, so this is prompt.
  for (auto& t : stream_threads_) t.join();
  stream_threads_.clear();
}

void WorkerPool::StreamLoop(Rank* rank, uint64_t seen) {
  while (true) {
    {
      absl::MutexLock lock(&step_mu_);
      auto ready = [this, &seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stop_threads_ || step_seq_ != seen;
      };
      step_mu_.Await(absl::Condition(&ready));
      if (stop_threads_) return;
      seen = step_seq_;
    }
    RunRank(rank);
    absl::MutexLock lock(&step_mu_);
    --pending_;
  }
}

void WorkerPool::PrepareMasks() {
  (*fill_masks_)(step_plan_);
  MasksToProto(*step_plan_, &wire_masks_);
}

void WorkerPool::RunRank(Rank* rank) {
  rank->status = absl::OkStatus();
  bool ok = rank->stream->Write(wire_plan_);
  if (ok && rank == ranks_[0].get() && wire_plan_.masks_follow()) {
    if (stream_threads_.empty()) {
      PrepareMasks();  // one rank, on the loop thread: while the worker runs the forward pass
    } else {
      absl::MutexLock lock(&step_mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return masks_ready_; };
      step_mu_.Await(absl::Condition(&ready));
    }
    ok = rank->stream->Write(wire_masks_);
  }
  if (!ok || !rank->stream->Read(&rank->result)) {
    rank->status = absl::UnavailableError(absl::StrCat("worker ", rank->address, " failed"));
    // Its own status before anything cancels it: once cancelled, Finish()
    // says CANCELLED, and a lost connection (a stopped worker's keepalive
    // timing out) would be reported as a cancellation of ours.
    rank->ended = rank->stream->Finish();
    rank->stream.reset();
    Rank* none = nullptr;
    first_failed_.compare_exchange_strong(none, rank);
    // A failed rank cancels every stream, so ranks blocked in a collective
    // with the dead one (or on us) return at once.
    for (auto& r : ranks_) r->context->TryCancel();
  }
}

void WorkerPool::Disconnect() {
  StopStreamThreads();
  for (auto& rank : ranks_) {
    if (rank->context != nullptr) rank->context->TryCancel();
    if (rank->stream != nullptr) (void)rank->stream->Finish();
    rank->stream.reset();
    rank->context.reset();
  }
  connected_ = false;
}

absl::Status WorkerPool::Probe() {
  for (auto& rank : ranks_) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(absl::Seconds(2)));
    options_.auth.Attach(&ctx);
    internal::v1::StoreGetRequest req;  // no keys: answered at once
    internal::v1::StoreGetResponse resp;
    grpc::Status s = rank->stub->StoreGet(&ctx, req, &resp);
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat("worker ", rank->address, " is unreachable: ", s.error_message()));
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerPool::Connect() {
  step_times_.clear();  // a new session: warm-up first, then its own step times
  Disconnect();
  draining_.clear();
  // A cheap probe first: joining blocks in the collective rendezvous until
  // every rank is there, so do not start unless all of them answer.
  RETURN_IF_ERROR(Probe());
  std::mt19937_64 rng(std::random_device{}());
  const std::string session = absl::StrFormat("s%016x-%d", rng(), ++sessions_);
  const int n = world_size();
  std::vector<internal::v1::JoinResponse> responses(n);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      internal::v1::JoinRequest req = options_.join;
      req.set_session(session);
      req.set_rank(r);
      req.set_world_size(n);
      req.set_rendezvous(options_.addresses[0]);
      req.set_coordinator(options_.coordinator_id);
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline(options_.join_timeout));
      options_.auth.Attach(&ctx);
      grpc::Status s = ranks_[r]->stub->Join(&ctx, req, &responses[r]);
      if (!s.ok()) statuses[r] = FromGrpcStatus(s, absl::StrCat("join worker ", ranks_[r]->address));
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  int64_t capacity = responses[0].kv_capacity_chunks();
  int64_t bytes = 0;
  int64_t host_slots = responses[0].host_kv_slots(), disk_slots = responses[0].disk_kv_slots();
  for (const auto& resp : responses) {
    capacity = std::min(capacity, resp.kv_capacity_chunks());
    bytes += resp.kv_chunk_bytes();
    // A slot index names every rank's shard of a chunk: only the slots all
    // ranks have are usable.
    host_slots = std::min(host_slots, resp.host_kv_slots());
    disk_slots = std::min(disk_slots, resp.disk_kv_slots());
  }
  host_kv_slots_ = std::max<int64_t>(host_slots, 0);
  disk_kv_slots_ = std::max<int64_t>(disk_slots, 0);
  // The shared tier is on when every rank names its keys (a rank without
  // one, or with a prefix no key of ours would have, turns it off).
  kv_store_key_prefixes_.clear();
  for (const auto& resp : responses) {
    const std::string& p = resp.kv_store_key_prefix();
    const bool printable = std::all_of(p.begin(), p.end(), [](char c) { return c > ' ' && c < 127; });
    if (p.empty() || p.size() > 256 || !printable) {
      kv_store_key_prefixes_.clear();
      break;
    }
    kv_store_key_prefixes_.push_back(p);
  }
  if (options_.max_kv_chunks > 0) capacity = std::min(capacity, options_.max_kv_chunks);
  num_chunks_ = capacity;
  chunk_bytes_total_ = bytes;
  dtype_ = responses[0].dtype();
  device_ = responses[0].device();
  kv_dtype_ = responses[0].kv_dtype();
  for (auto& rank : ranks_) {
    rank->context = std::make_unique<grpc::ClientContext>();
    options_.auth.Attach(rank->context.get());
    rank->context->AddMetadata(kSessionMetadata, session);
    rank->stream = rank->stub->Execute(rank->context.get());
  }
  connected_ = true;
  sized_ = false;
  StartStreamThreads();
  return absl::OkStatus();
}

absl::StatusOr<StepResult> WorkerPool::Step(StepPlan* step, const std::function<void(StepPlan*)>& fill_masks) {
  if (!connected_) return absl::UnavailableError("the workers are not connected");
  ToProto(*step, &wire_plan_);
  step_plan_ = step;
  fill_masks_ = &fill_masks;
  if (!sized_) {
    wire_plan_.set_num_kv_chunks(num_chunks_);
    sized_ = true;
  } else {
    wire_plan_.clear_num_kv_chunks();
  }
  first_failed_ = nullptr;
  step_timed_out_ = false;
  const absl::Time started = absl::Now();
  absl::Duration timeout;
  {
    absl::MutexLock lock(&watch_mu_);
    step_started_ = started;
    step_timeout_ = options_.adaptive_step_timeout ? AdaptiveStepTimeout(step_times_) : options_.step_timeout;
    timeout = step_timeout_;
  }
  if (stream_threads_.empty()) {
    RunRank(ranks_[0].get());
  } else {
    {
      absl::MutexLock lock(&step_mu_);
      pending_ = static_cast<int>(ranks_.size());
      masks_ready_ = false;
      ++step_seq_;
    }
    // The ranks write the plan and run its forward pass; rank 0's thread
    // waits for the masks only before writing them after it.
    if (wire_plan_.masks_follow()) PrepareMasks();
    absl::MutexLock lock(&step_mu_);
    masks_ready_ = true;
    auto done = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return pending_ == 0; };
    step_mu_.Await(absl::Condition(&done));
  }
  step_plan_ = nullptr;
  fill_masks_ = nullptr;
  {
    absl::MutexLock lock(&watch_mu_);
    step_started_ = absl::InfiniteFuture();
  }
  if (step_timed_out_) {
    std::vector<Rank*> silent;
    for (auto& rank : ranks_) {
      if (!rank->status.ok()) silent.push_back(rank.get());  // its result never came
    }
    if (silent.empty()) {  // answered as the watchdog fired: the streams are cancelled all the same
      for (auto& rank : ranks_) silent.push_back(rank.get());
    }
    // Which one hangs: a rank that waits on a peer in a collective still
    // answers a probe at once; a stopped or stuck process does not. Probed
    // together, 300 ms each, so the failure is reported within the second.
    std::vector<std::future<bool>> answers;
    for (Rank* rank : silent) {
      answers.push_back(std::async(std::launch::async, [this, rank] {
        grpc::ClientContext ctx;
        ctx.set_deadline(Deadline(absl::Milliseconds(300)));
        options_.auth.Attach(&ctx);
        internal::v1::StoreGetRequest req;  // no keys: answered at once
        internal::v1::StoreGetResponse resp;
        return rank->stub->StoreGet(&ctx, req, &resp).ok();
      }));
    }
    std::vector<std::string> hung, waiting;
    for (size_t i = 0; i < silent.size(); ++i) (answers[i].get() ? waiting : hung).push_back(silent[i]->address);
    Disconnect();
    step_times_.clear();  // the next session measures afresh
    return absl::UnavailableError(absl::StrCat(
        "worker ", absl::StrJoin(hung.empty() ? waiting : hung, ", "), " did not answer within ",
        absl::FormatDuration(timeout),
        options_.adaptive_step_timeout ? " (--step_timeout_s auto: 20x the slowest recent step, at least 5 s)"
                                       : " (--step_timeout_s)",
        hung.empty() ? ": overloaded (it answers a probe)" : ": hung (it answers no probe either)",
        !hung.empty() && !waiting.empty() ? absl::StrCat("; ", absl::StrJoin(waiting, ", "),
                                                         " answers a probe (waiting on its peers)")
                                          : ""));
  }
  if (first_failed_.load() != nullptr) {
    // Each failed worker's own status says why. Name first the ranks whose
    // connection broke (a dead process), then those that reported an error
    // (a rank whose collective lost the dead peer may answer first), and
    // those we cancelled only when nothing else is known.
    std::vector<std::string> lost, errors, cancelled;
    for (auto& rank : ranks_) {
      if (rank->status.ok()) continue;
      const grpc::Status& s = rank->ended;  // read by RunRank, which failed it
      const std::string what =
          absl::StrCat("worker ", rank->address, " failed: ", s.ok() ? "stream closed" : s.error_message());
      (s.error_code() == grpc::StatusCode::UNAVAILABLE ? lost
       : s.error_code() == grpc::StatusCode::CANCELLED ? cancelled
                                                       : errors)
          .push_back(what);
    }
    Disconnect();
    lost.insert(lost.end(), errors.begin(), errors.end());
    return absl::UnavailableError(absl::StrJoin(lost.empty() ? cancelled : lost, "; "));
  }
  for (auto& rank : ranks_) {
    if (rank->result.draining() && draining_.empty()) draining_ = rank->address;
  }
  step_times_.push_back(absl::Now() - started);
  if (step_times_.size() > kStepHistory) step_times_.pop_front();
  StepResult result;
  FromProto(ranks_[0]->result, &result);
  // A move failed if it failed on any rank (the chunk is then not whole):
  // the union, in increasing order, of the indices that name a move.
  result.failed_moves.clear();
  const int32_t moves = static_cast<int32_t>(step->moves.size());
  for (const auto& rank : ranks_) {
    for (int32_t k : rank->result.failed_moves()) {
      if (k >= 0 && k < moves) result.failed_moves.push_back(k);
    }
    StepResult r;  // the slowest rank's shared-tier loads hold the step
    FromProto(rank->result, &r);
    result.shared_load_seconds = std::max(result.shared_load_seconds, r.shared_load_seconds);
  }
  std::sort(result.failed_moves.begin(), result.failed_moves.end());
  result.failed_moves.erase(std::unique(result.failed_moves.begin(), result.failed_moves.end()),
                            result.failed_moves.end());
  return result;
}

}  // namespace chunkattn
