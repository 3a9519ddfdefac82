// The coordinator's side of the tensor-parallel workers: joins them into a
// session (rank, world size, model, chunk size, rendezvous), sizes the KV
// pool from the smallest capacity they report, and runs one plan per
// iteration on all of them (each rank computes its shard; rank 0 returns the
// sampled tokens, every rank the KV moves it failed).
//
// Failure: any worker that fails, disappears or does not answer a step
// within the step timeout (a hung or SIGSTOPped process: TCP alone would
// not notice) fails the step with UNAVAILABLE; every stream is then
// cancelled (so no rank stays blocked on the coordinator) and the pool must
// be Connect()ed again.
//
// Thread-compatible: driven by the coordinator's loop thread. With more than
// one rank, each rank's stream is written and read on its own thread, started
// at Connect() and kept until Disconnect() (none is created per step), so a
// rank blocked in a collective with a dead peer cannot delay noticing the
// dead one. With a step timeout a watchdog thread, kept for the pool's
// lifetime, polls the step in flight and cancels the streams once it is
// overdue (polling: a step pays no wake-up).
#ifndef CHUNKATTN_SERVICES_COORDINATOR_WORKER_POOL_H_
#define CHUNKATTN_SERVICES_COORDINATOR_WORKER_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/grpc_security.h"
#include "chunkattn/internal/v1/worker.grpc.pb.h"
#include "proto/plan/step_plan.h"
#include "services/coordinator/worker_group.h"

namespace chunkattn {

struct WorkerPoolOptions {
  std::vector<std::string> addresses;  // host:port, rank order
  // Model, chunk size, dtypes, decode impl; rank, world size, session and
  // rendezvous are filled per worker.
  internal::v1::JoinRequest join;
  int64_t max_kv_chunks = 0;  // caps the pool; 0 = what the workers hold
  absl::Duration join_timeout = absl::Seconds(120);  // loading weights included
  TokenAuth auth;  // the worker token, sent on every call
  // Plaintext, or TLS (a client certificate for the workers' mutual TLS, and
  // the one name every worker's certificate carries).
  ChannelSecurity channel;
  // Names this coordinator to the workers (they serve one at a time); empty =
  // drawn at random by the pool.
  std::string coordinator_id;
  // A step not answered by every rank within this fails (UNAVAILABLE);
  // InfiniteDuration = wait as long as the connections live.
  absl::Duration step_timeout = absl::InfiniteDuration();
  // Instead of step_timeout: AdaptiveStepTimeout of the steps just run.
  bool adaptive_step_timeout = false;
};

// The step deadline from the steps just run (`recent`, the last up to
// kStepHistory): 20 times the slowest, within [5 s, 120 s], so that a worker
// whose steps are slow but steady (a long prefill on a CPU) is not taken for
// hung, and a hung one is noticed in seconds when steps are fast. Until
// kStepHistory / 8 steps have run since a join (warm-up, graph capture): 60 s.
inline constexpr size_t kStepHistory = 64;
absl::Duration AdaptiveStepTimeout(const std::deque<absl::Duration>& recent);

class WorkerPool final : public WorkerGroup {
 public:
  explicit WorkerPool(WorkerPoolOptions options);
  ~WorkerPool() override;
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Probes every worker, then joins them all into a fresh session and opens
  // their plan streams. UNAVAILABLE while some worker is unreachable; the
  // worker's own status when a Join fails (a bad model path, say).
  absl::Status Connect() override;
  // Cancels the streams; Connect() starts over.
  void Disconnect() override;
  bool connected() const { return connected_; }

  // Runs one plan on every rank (converted to its wire form once) and
  // returns rank 0's result, with the union of every rank's failed_moves.
  // The first plan after Connect() carries the pool size. Masks that follow
  // the plan are written to rank 0's stream after it, once fill_masks has
  // run here. UNAVAILABLE (with the worker and its
  // error) when any rank fails; the pool is then disconnected.
  absl::StatusOr<StepResult> Step(StepPlan* plan, const std::function<void(StepPlan*)>& fill_masks) override;

  // One cheap authenticated call to every rank (no session needed): OK while
  // all answer, else UNAVAILABLE naming the first that does not (gone, or
  // refusing because it is shutting down). For an idle coordinator, which
  // has no step to notice a lost or draining worker by.
  absl::Status Probe() override;
  // The address of a rank that said in its last step result that it is
  // shutting down (SIGTERM: it serves on until the coordinator releases it);
  // empty if none.
  const std::string& draining() const override { return draining_; }

  int world_size() const override { return static_cast<int>(options_.addresses.size()); }
  int64_t num_chunks() const override { return num_chunks_; }
  int64_t chunk_bytes_total() const override { return chunk_bytes_total_; }  // one chunk over all ranks
  const std::string& dtype() const override { return dtype_; }
  const std::string& device() const override { return device_; }
  const std::string& kv_dtype() const override { return kv_dtype_; }
  int64_t host_kv_slots() const override { return host_kv_slots_; }
  int64_t disk_kv_slots() const override { return disk_kv_slots_; }
  const std::vector<std::string>& kv_store_key_prefixes() const override { return kv_store_key_prefixes_; }

 private:
  struct Rank;

  // Writes the current plan to `rank`'s stream (and to rank 0 its masks,
  // once masks_gate_ says they are ready) and reads its result; the first
  // rank to fail cancels every stream.
  void RunRank(Rank* rank);
  // The plan in flight's masks, on the loop thread: fills them and converts
  // them to wire_masks_.
  void PrepareMasks();
  // Runs `rank`'s part of every step after step number `seen`.
  void StreamLoop(Rank* rank, uint64_t seen);
  void StartStreamThreads();
  void StopStreamThreads();
  void Watchdog();

  WorkerPoolOptions options_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  bool connected_ = false;
  bool sized_ = false;
  uint64_t sessions_ = 0;
  int64_t num_chunks_ = 0;
  int64_t chunk_bytes_total_ = 0;
  int64_t host_kv_slots_ = 0;  // the fewest any rank has
  int64_t disk_kv_slots_ = 0;
  std::vector<std::string> kv_store_key_prefixes_;  // per rank; empty: no shared tier
  std::string dtype_;
  std::string device_;
  std::string kv_dtype_;
  std::string draining_;
  internal::v1::StepPlan wire_plan_;  // reused across steps
  internal::v1::StepPlan wire_masks_;  // the masks that follow it (masks_follow)
  // The step in flight's plan and mask filler (loop thread only).
  StepPlan* step_plan_ = nullptr;
  const std::function<void(StepPlan*)>* fill_masks_ = nullptr;
  std::atomic<Rank*> first_failed_{nullptr};

  // The stream threads' hand-off: Step() bumps step_seq_ and waits until
  // pending_ is back to 0; wire_plan_ is only read while a step is pending.
  absl::Mutex step_mu_;
  uint64_t step_seq_ ABSL_GUARDED_BY(step_mu_) = 0;
  int pending_ ABSL_GUARDED_BY(step_mu_) = 0;
  bool masks_ready_ ABSL_GUARDED_BY(step_mu_) = false;  // wire_masks_ holds the step's masks
  bool stop_threads_ ABSL_GUARDED_BY(step_mu_) = false;
  std::vector<std::thread> stream_threads_;

  // The watchdog: Step() sets step_started_ (under watch_mu_, so the
  // watchdog never cancels a context Disconnect() is freeing) and clears it
  // when the step is over.
  absl::Mutex watch_mu_;
  absl::Time step_started_ ABSL_GUARDED_BY(watch_mu_) = absl::InfiniteFuture();  // none in flight
  absl::Duration step_timeout_ ABSL_GUARDED_BY(watch_mu_);  // the step in flight's
  std::deque<absl::Duration> step_times_;  // Step()'s caller only: the last kStepHistory, since the join
  bool stop_watchdog_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::atomic<bool> step_timed_out_{false};
  std::thread watchdog_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_WORKER_POOL_H_
