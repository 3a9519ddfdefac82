// The cache coordinator's engine: one loop thread owns the scheduler (and
// through it the prefix forest and chunk allocator) and the worker pool. RPC
// handlers post requests and cancellations to its inbox and never block. The
// loop only schedules and steps: it hands each step's sampled tokens to the
// OutputProcessor, whose own thread detokenizes, applies stop strings and
// writes to each request's sink (output_processor.h).
//
// Worker failure: the step fails with UNAVAILABLE, every request in flight
// ends with UNAVAILABLE, the engine reports not ready (health NOT_SERVING)
// and keeps re-joining the workers; once they are back it starts over with
// an empty cache (their KV pools are new). While idle the loop probes the
// workers every second, so a worker lost then turns health NOT_SERVING at
// once rather than failing the next request.
//
// Worker shutdown (a worker's SIGTERM, as in a rolling update): the worker
// says so in its step results (or refuses the idle probe); nothing new
// starts, the running requests finish, then the engine releases the workers
// and keeps the queued requests until they re-join. Nothing fails unless the
// running requests outlast the worker's --drain_timeout_s.
//
// Thread-safe: Submit, Cancel, ready, Snapshot may be called from any thread.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_ENGINE_H_
#define CHUNKATTN_SERVICES_COORDINATOR_ENGINE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/redis_client.h"
#include "base/thread_pool.h"
#include "proto/model/model_config.h"
#include "services/coordinator/output_processor.h"
#include "services/coordinator/worker_group.h"
#include "services/coordinator/worker_pool.h"
#include "services/kv_events/kv_events.h"
#include "services/kv_events/publisher.h"
#include "services/metrics/metrics.h"
#include "services/core/scheduler.h"
#include "services/core/shared_kv_probe.h"
#include "text/tokenizer.h"

namespace chunkattn {

// A request as the engine runs it: checked and tokenized by the input
// processor (input_processor.h).
struct EngineRequest {
  std::string request_id;  // the client's, echoed
  std::string owner;       // the caller's tenant (TokenAuth::Authenticate): whose Abort reaches it
  RequestSpec spec;
  std::vector<std::string> stop_strings;
};

// Marks the CANCELLED status of a request ended by an Abort call (as
// against a client that cancelled its own call).
inline constexpr char kAbortedPayload[] = "chunkattn.engine.aborted";
inline bool IsAbortedByCall(const absl::Status& status) {
  return status.code() == absl::StatusCode::kCancelled && status.GetPayload(kAbortedPayload).has_value();
}

struct EngineOptions {
  SchedulerOptions scheduler;  // num_chunks is taken from the workers
  WorkerPoolOptions workers;
  absl::Duration reconnect_interval = absl::Milliseconds(500);
  // Requests queued (admitted to the scheduler, not yet running) beyond which
  // a new one is refused at once with RESOURCE_EXHAUSTED; 0 = unbounded.
  int64_t max_waiting_requests = 0;
  // The model_name label of the vllm:* series (the served model name).
  std::string model_name;
  // KV-cache events (services/kv_events): after every step the forest's
  // block changes are published here, AllBlocksCleared when a worker
  // session starts or ends (its KV pools are new). Borrowed, outlives the
  // engine; null = off (the forest then records nothing).
  KvEventPublisher* kv_events = nullptr;
  std::string kv_events_hash_seed = "0";  // block_hash.h's seed
  // Threads that compute a step's token masks (structured outputs), the
  // loop's own included, while the workers run the step's forward pass.
  int mask_threads = 1;
  // The shared KV tier (issue 41), as workers.join.kv_store_url: the engine
  // probes it for each new request's blocks (SharedKvProbe); empty = off.
  // Holds a password: never logged (RedactRedisUrl).
  std::string kv_store_url;
  RedisTlsOptions kv_store_tls;  // a rediss:// URL's (its key: a secret)
};

// The cache's blocks at one point of the KV-event stream: every event with a
// sequence number below next_seq has been published, none after.
struct KvBlocksSnapshot {
  uint64_t next_seq = 0;
  std::vector<KvBlockInfo> blocks;  // ListBlocks; empty while no workers are joined
};

class Engine {
 public:
  // `config` and `tokenizer` (may be null: token ids only) are borrowed;
  // `metrics` too, and must outlive the engine. `workers` null: a WorkerPool
  // over options.workers.
  Engine(EngineOptions options, const ModelConfig* config, const Tokenizer* tokenizer,
         metrics::Registry* metrics, std::unique_ptr<WorkerGroup> workers = nullptr);
  ~Engine();  // stops the loop; requests in flight end with UNAVAILABLE

  void Start();
  // Ends the loop: requests in flight and queued end with UNAVAILABLE, and
  // the ready callback is called for the last time. Idempotent.
  void Stop();

  // Returns the engine's id for the request (for Cancel). The sink gets the
  // responses, or one Finish with the error (INVALID_ARGUMENT, or
  // RESOURCE_EXHAUSTED for a request that can never fit the pool or when
  // max_waiting_requests are queued).
  int64_t Submit(EngineRequest request, std::shared_ptr<ResponseSink> sink);
  // Stops a request (client cancel, deadline): its chunks are released and
  // its sink finishes with CANCELLED. Unknown ids are ignored.
  void Cancel(int64_t id);
  // Cancels, as Cancel does, the open requests of `owner` whose client
  // request_id is one of `request_ids`; `done` gets those request ids (each
  // once), on another thread, or at once when the engine has stopped.
  // Requests submitted before the call are found.
  void Abort(std::string owner, std::vector<std::string> request_ids,
             std::function<void(std::vector<std::string> aborted)> done);
  // The cache's blocks (for routers' and tests' checks of the KV-event
  // stream), taken on the loop thread in inbox order; `done` gets them on it.
  // FAILED_PRECONDITION when KV events are off, UNAVAILABLE once stopped.
  void KvBlocks(std::function<void(absl::StatusOr<KvBlocksSnapshot>)> done);
  // Restarts the scheduler's peak KV use from now, in inbox order (so before
  // any request submitted after this call).
  void ResetPeaks();

  // Graceful shutdown, first half (SIGTERM): from now on Submit refuses with
  // UNAVAILABLE; what was submitted before runs on. True once nothing is left
  // to run and every response is with its sink, false when `timeout` passed
  // first (Stop() then ends the rest with UNAVAILABLE). Blocks the caller.
  bool Drain(absl::Duration timeout);

  // Whether the workers are joined and requests are served.
  bool ready() const { return ready_.load(); }
  // Called (from the loop thread) whenever ready() changes.
  void SetReadyCallback(std::function<void(bool)> callback);

  // One KV tier below the pool, since the workers joined (GetCacheStats):
  // KvTierStats split by tier.
  struct TierSnapshot {
    KvTier tier = KvTier::kHost;
    int64_t blocks = 0;
    int64_t capacity_blocks = 0;  // 0: the shared tier (the store bounds it)
    int64_t hits_total = 0;
    int64_t loads_total = 0;
    double load_seconds_total = 0;  // the shared tier's (the slowest rank's, per step)
    int64_t stores_total = 0;
    int64_t fallbacks_total = 0;
    int64_t drops_total = 0;
  };
  struct Snapshot {
    int64_t num_chunks = 0;
    int64_t chunk_bytes_total = 0;
    std::string dtype;
    std::string device;
    std::string kv_dtype;  // as the workers resolved it
    CacheStats cache;
    SchedulerStats scheduler;
    int64_t prompt_tokens_total = 0;
    int64_t cached_prompt_tokens_total = 0;
    int64_t generation_tokens_total = 0;
    std::vector<TierSnapshot> tiers;  // the tiers the workers have: host, disk, shared
  };
  Snapshot snapshot() const;

 private:
  struct Command {
    enum Kind { kSubmit, kCancel, kResetPeaks, kFinishSample, kTask } kind;
    int64_t id = 0;
    int32_t index = 0;  // kFinishSample; kCancel: 1 when an Abort call asked
    EngineRequest request;
    std::shared_ptr<ResponseSink> sink;
    std::function<void()> task;  // kTask: run on the loop thread, in inbox order
  };

  void Loop();
  bool Connect();
  void DrainInbox(bool serving);
  void Step();
  void Post(Command command);
  // Runs `task` on the loop thread in inbox order; false once the loop has ended.
  bool PostTask(std::function<void()> task);
  // Publishes the forest's block changes since the last call (loop thread).
  void PublishKvEvents();
  // Every block is gone (a new or ended worker session): AllBlocksCleared.
  void ClearKvEvents();
  void CountAndPublish(std::vector<KvEvent> events, absl::Time start);
  void FailAll(const absl::Status& status);
  // A worker is shutting down and nothing runs: disconnect, keeping the queue.
  void ReleaseWorkers();
  // The worker session is over (its KV pools with it): not ready, re-join.
  void EndSession();
  void SetReady(bool ready);
  void UpdateGauges();
  void UpdateTenantGauges(const CacheStats& cs);
  std::vector<TierSnapshot> TierSnapshots(const KvTierStats& ts, const KvTierMapOptions& options) const;

  EngineOptions options_;
  const ModelConfig* config_;
  const Tokenizer* tokenizer_;
  metrics::Registry* metrics_;

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> next_id_{1};

  absl::Mutex inbox_mu_;
  absl::CondVar inbox_cv_;
  std::deque<Command> inbox_ ABSL_GUARDED_BY(inbox_mu_);
  std::function<void(bool)> ready_callback_ ABSL_GUARDED_BY(inbox_mu_);
  // The loop has nothing to run (set where it goes idle, cleared when it
  // takes commands): with an empty inbox, Drain is over.
  bool idle_ ABSL_GUARDED_BY(inbox_mu_) = true;
  bool closed_ ABSL_GUARDED_BY(inbox_mu_) = false;  // the loop has ended

  mutable absl::Mutex snapshot_mu_;
  Snapshot snapshot_ ABSL_GUARDED_BY(snapshot_mu_);

  // Loop thread only.
  std::unique_ptr<WorkerGroup> pool_;
  ThreadPool mask_pool_;  // SchedulerOptions::mask_pool; options_.mask_threads
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<OutputProcessor> output_;  // thread-safe; its own thread
  int64_t evictions_seen_ = 0;
  KvTierStats tiers_seen_;  // the session's tier totals already counted
  // Retention (services/core/retention.h): the session's totals already counted.
  std::array<int64_t, kNumRetentionBands> band_evictions_seen_{};
  int64_t retention_capped_seen_ = 0;
  double shared_load_seconds_ = 0;  // the session's
  int64_t preemptions_seen_ = 0;
  // Per tenant seen: its running, waiting, sequence, KV chunk and retained
  // KV chunk gauges (kept at 0 once idle).
  std::map<std::string, std::array<metrics::Gauge*, 5>> tenant_gauges_;
  // When they were last set, and for which running and waiting totals: they
  // walk every tenant and cache namespace, so a step refreshes them only when
  // a request started or ended, or kTenantGaugePeriod passed (UpdateGauges).
  absl::Time tenant_gauges_at_ = absl::InfinitePast();
  std::pair<int64_t, int64_t> tenant_gauges_totals_{-1, -1};
  // Queued requests kept for the next worker session (see ReleaseWorkers).
  std::vector<std::pair<int64_t, RequestSpec>> held_;
  absl::Time next_probe_ = absl::InfinitePast();
  std::unique_ptr<KvEventTracker> kv_tracker_;  // with options_.kv_events

  // Metric series (owned by the registry).
  metrics::Counter* m_prompt_tokens_;
  metrics::Counter* m_prompt_cached_;
  metrics::Counter* m_generation_tokens_;
  metrics::Gauge* m_chunks_used_;
  metrics::Gauge* m_chunks_cached_;
  metrics::Gauge* m_chunks_free_;
  metrics::Gauge* m_chunk_bytes_;
  metrics::Gauge* m_shared_chunks_;
  metrics::Gauge* m_logical_tokens_;
  metrics::Gauge* m_physical_tokens_;
  metrics::Counter* m_evicted_;
  // Retention: pool chunks per band, pool evictions and tier drops by band,
  // chunks a tenant's bound left unraised.
  std::array<metrics::Gauge*, kNumRetentionBands> m_band_chunks_{};
  std::array<metrics::Counter*, kNumRetentionBands> m_band_evictions_{};
  std::array<metrics::Counter*, kNumRetentionBands> m_band_tier_drops_{};
  metrics::Counter* m_retention_capped_ = nullptr;
  // The KV tiers below the pool, by tier (host, disk).
  struct TierMetrics {
    metrics::Gauge* blocks;
    metrics::Gauge* slots;
    metrics::Counter* loads;
  };
  TierMetrics m_host_tier_, m_disk_tier_;
  metrics::Counter* m_tier_stores_;
  metrics::Counter* m_tier_demotions_;
  metrics::Counter* m_tier_drops_;
  metrics::Counter* m_tier_failed_;
  // The shared tier (Redis): blocks believed there, and its traffic.
  metrics::Gauge* m_shared_known_;
  metrics::Counter* m_shared_loads_;
  metrics::Counter* m_shared_stores_;
  metrics::Counter* m_shared_hits_;
  metrics::Counter* m_shared_fallbacks_;
  metrics::Counter* m_shared_failed_stores_;
  metrics::Counter* m_shared_probes_;
  metrics::Counter* m_shared_probe_failures_;
  metrics::Histogram* m_shared_load_seconds_;
  SharedKvProbeStats probes_seen_;
  metrics::Gauge* m_oldest_cached_;
  metrics::Gauge* m_running_;
  metrics::Gauge* m_waiting_;
  metrics::Counter* m_preemptions_;
  metrics::Gauge* m_workers_ready_;
  metrics::Histogram* m_step_;
  // vLLM's names for the same figures, read by routers that score vLLM
  // servers (the Gateway API Inference Extension's endpoint picker).
  metrics::Gauge* m_vllm_running_;
  metrics::Gauge* m_vllm_waiting_;
  metrics::Gauge* m_vllm_kv_usage_;
  metrics::Gauge* m_vllm_gpu_cache_usage_;  // vLLM's older name of kv_cache_usage_perc
  metrics::Gauge* m_vllm_cache_config_ = nullptr;  // this worker session's; 1 while current
  // KV events (with options_.kv_events): loop-thread time spent turning the
  // forest's changes into events (hashing included; encoding and sending are
  // the publisher thread's), and what was published.
  metrics::Counter* m_kv_publish_seconds_ = nullptr;
  metrics::Counter* m_kv_batches_ = nullptr;
  metrics::Counter* m_kv_stored_ = nullptr;
  metrics::Counter* m_kv_removed_ = nullptr;
  metrics::Counter* m_kv_cleared_ = nullptr;

  // With options_.kv_store_url: its thread posts answers to the inbox, so it
  // is declared last (stopped first, while the inbox is still there).
  std::unique_ptr<SharedKvProbe> shared_probe_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_ENGINE_H_
