#include "services/coordinator/engine.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/tenant_namespace.h"

namespace chunkattn {

namespace {

void Log(const std::string& message) {
  std::fprintf(stderr, "%s coordinator: %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%E3S", absl::Now(), absl::UTCTimeZone()).c_str(),
               message.c_str());
}

// Between two liveness probes of the workers while nothing runs.
constexpr absl::Duration kIdleProbeInterval = absl::Seconds(1);
// The per-tenant gauges walk every tenant and cache namespace: not every step.
constexpr absl::Duration kTenantGaugePeriod = absl::Milliseconds(250);

// How long a new request waits for its shared-tier probe before it is
// admitted without (the probe's own bounds: a queued probe 100 ms, a round
// trip 50 ms, a connect 50 ms).
constexpr absl::Duration kSharedProbeWait = absl::Milliseconds(250);

// Latency buckets, seconds: 1 ms .. ~65 s.
std::vector<double> LatencyBuckets() { return metrics::ExponentialBuckets(0.001, 2, 17); }

}  // namespace

Engine::Engine(EngineOptions options, const ModelConfig* config, const Tokenizer* tokenizer,
               metrics::Registry* metrics, std::unique_ptr<WorkerGroup> workers)
    : options_(std::move(options)),
      config_(config),
      tokenizer_(tokenizer),
      metrics_(metrics),
      pool_(std::move(workers)),
      mask_pool_(std::max(1, options_.mask_threads)) {
  metrics::Registry& m = *metrics_;
  m_prompt_tokens_ = &m.GetCounter("chunkattn_prompt_tokens_total", "Prompt tokens of started requests.");
  m_prompt_cached_ = &m.GetCounter("chunkattn_prompt_tokens_cached_total",
                                   "Prompt tokens whose KV came from the prefix cache.");
  m_generation_tokens_ = &m.GetCounter("chunkattn_generation_tokens_total", "Generated tokens.");
  const std::string chunks_help = "KV chunks by state (used by running sequences, cached for reuse, free).";
  m_chunks_used_ = &m.GetGauge("chunkattn_kv_chunks", chunks_help, {{"state", "used"}});
  m_chunks_cached_ = &m.GetGauge("chunkattn_kv_chunks", chunks_help, {{"state", "cached"}});
  m_chunks_free_ = &m.GetGauge("chunkattn_kv_chunks", chunks_help, {{"state", "free"}});
  m_chunk_bytes_ = &m.GetGauge("chunkattn_kv_chunk_bytes", "Bytes of one KV chunk over all ranks.");
  m_shared_chunks_ = &m.GetGauge("chunkattn_kv_shared_chunks", "KV chunks read by two or more running sequences.");
  m_logical_tokens_ = &m.GetGauge("chunkattn_kv_logical_tokens", "Sum of the running sequences' lengths.");
  m_physical_tokens_ = &m.GetGauge("chunkattn_kv_physical_tokens", "Tokens stored in used KV chunks.");
  m_evicted_ = &m.GetCounter("chunkattn_kv_evicted_chunks_total", "Cached KV chunks evicted (LRU).");
  for (int b = 0; b < kNumRetentionBands; ++b) {
    const std::string band = RetentionBandName(static_cast<RetentionBand>(b));
    m_band_chunks_[b] = &m.GetGauge("chunkattn_kv_retention_chunks",
                                    "KV chunks (in use or cached) by retention priority band: below, at or above "
                                    "the default priority 35.",
                                    {{"band", band}});
    m_band_evictions_[b] = &m.GetCounter("chunkattn_kv_retention_evictions_total",
                                         "Cached KV chunks evicted from the pool, by their retention band.",
                                         {{"band", band}});
    m_band_tier_drops_[b] = &m.GetCounter("chunkattn_kv_tier_retention_drops_total",
                                          "KV blocks a full tier forgot or refused, by their retention band.",
                                          {{"band", band}});
  }
  m_retention_capped_ = &m.GetCounter("chunkattn_kv_retention_capped_chunks_total",
                                      "KV chunks a request asked to raise that its tenant's "
                                      "--max_retained_chunks_per_tenant left at the default priority.");
  for (auto [tm, tier] : {std::pair<TierMetrics*, const char*>{&m_host_tier_, "host"}, {&m_disk_tier_, "disk"}}) {
    tm->blocks = &m.GetGauge("chunkattn_kv_tier_blocks", "KV blocks kept in a tier below the pool.", {{"tier", tier}});
    tm->slots = &m.GetGauge("chunkattn_kv_tier_slots", "KV blocks a tier below the pool holds (0: off).",
                            {{"tier", tier}});
    tm->loads = &m.GetCounter("chunkattn_kv_tier_loads_total", "KV blocks loaded back into the pool from a tier.",
                              {{"tier", tier}});
  }
  m_tier_stores_ = &m.GetCounter("chunkattn_kv_tier_stores_total", "KV blocks the pool evicted into a tier.");
  m_tier_demotions_ = &m.GetCounter("chunkattn_kv_tier_demotions_total", "KV blocks moved from the host to disk.");
  m_tier_drops_ = &m.GetCounter("chunkattn_kv_tier_drops_total", "KV blocks a full tier forgot (LRU).");
  m_tier_failed_ = &m.GetCounter("chunkattn_kv_tier_failed_moves_total",
                                 "KV tier moves a worker failed (corrupt, missing or unwritable: recomputed).");
  m_shared_known_ = &m.GetGauge("chunkattn_kv_tier_blocks", "KV blocks kept in a tier below the pool.",
                                {{"tier", "shared"}});
  m_shared_loads_ = &m.GetCounter("chunkattn_kv_tier_loads_total", "KV blocks loaded back into the pool from a tier.",
                                  {{"tier", "shared"}});
  m_shared_stores_ = &m.GetCounter("chunkattn_kv_tier_shared_stores_total",
                                   "KV blocks written to the shared tier (Redis).");
  m_shared_hits_ = &m.GetCounter("chunkattn_kv_tier_shared_hits_total",
                                 "KV blocks a probe found in the shared tier (stored by any replica).");
  m_shared_fallbacks_ = &m.GetCounter("chunkattn_kv_tier_shared_fallbacks_total",
                                      "Shared-tier loads that failed (missing, corrupt, slow or down): recomputed.");
  m_shared_failed_stores_ = &m.GetCounter("chunkattn_kv_tier_shared_failed_stores_total",
                                          "Shared-tier stores a worker could not queue or send.");
  m_shared_probes_ = &m.GetCounter("chunkattn_kv_tier_shared_probes_total",
                                   "New requests whose blocks were looked up in the shared tier.");
  m_shared_probe_failures_ = &m.GetCounter("chunkattn_kv_tier_shared_probe_failures_total",
                                           "Shared-tier probes answered empty: the store was slow, down or refused.");
  m_shared_load_seconds_ = &m.GetHistogram("chunkattn_kv_tier_shared_load_seconds",
                                           "A step's loads from the shared tier, on its slowest rank.",
                                           LatencyBuckets());
  m_oldest_cached_ = &m.GetGauge("chunkattn_kv_oldest_cached_seconds",
                                 "Since the next KV chunk to evict lost its last user (0: none cached).");
  const std::string req_help = "Requests by state.";
  m_running_ = &m.GetGauge("chunkattn_requests", req_help, {{"state", "running"}});
  m_waiting_ = &m.GetGauge("chunkattn_requests", req_help, {{"state", "waiting"}});
  OutputMetrics om;
  om.prompt_tokens = m_prompt_tokens_;
  om.prompt_cached = m_prompt_cached_;
  const metrics::Labels model = {{"model_name", options_.model_name}};
  om.vllm_prefix_queries =
      &m.GetCounter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", model);
  om.vllm_prefix_hits = &m.GetCounter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", model);
  om.generation_tokens = m_generation_tokens_;
  const std::string fin_help = "Finished requests by reason.";
  for (const char* reason : kFinishLabels) {
    om.finished[reason] = &m.GetCounter("chunkattn_requests_finished_total", fin_help, {{"reason", reason}});
  }
  m_preemptions_ = &m.GetCounter("chunkattn_preemptions_total", "Requests preempted for memory (recomputed later).");
  m_workers_ready_ = &m.GetGauge("chunkattn_workers_ready", "1 when every worker is joined and serving.");
  om.ttft = &m.GetHistogram("chunkattn_time_to_first_token_seconds", "Arrival to first token.", LatencyBuckets());
  om.itl = &m.GetHistogram("chunkattn_inter_token_latency_seconds", "Between two tokens of a sample.",
                           LatencyBuckets());
  om.duration = &m.GetHistogram("chunkattn_request_duration_seconds", "Arrival to the last token.",
                                LatencyBuckets());
  m_step_ = &m.GetHistogram("chunkattn_step_duration_seconds", "One iteration on the workers.", LatencyBuckets());
  m_vllm_running_ = &m.GetGauge("vllm:num_requests_running", "Requests running (vLLM's name).", model);
  m_vllm_waiting_ = &m.GetGauge("vllm:num_requests_waiting", "Requests waiting to start (vLLM's name).", model);
  m_vllm_kv_usage_ = &m.GetGauge("vllm:kv_cache_usage_perc",
                                 "Fraction of KV chunks used by running requests, shared chunks counted once "
                                 "(1 = full; cached chunks are reusable, so not counted).",
                                 model);
  m_vllm_gpu_cache_usage_ = &m.GetGauge("vllm:gpu_cache_usage_perc", "As vllm:kv_cache_usage_perc (older name).", model);

  if (pool_ == nullptr) pool_ = std::make_unique<WorkerPool>(options_.workers);
  if (options_.kv_events != nullptr) {
    kv_tracker_ = std::make_unique<KvEventTracker>(options_.scheduler.chunk_size, options_.kv_events_hash_seed);
    m_kv_publish_seconds_ = &m.GetCounter("chunkattn_kv_events_publish_seconds_total",
                                          "Engine-loop time spent making KV-cache events (block hashes included).");
    m_kv_batches_ = &m.GetCounter("chunkattn_kv_event_batches_total", "KV-cache event batches published.");
    const std::string blocks_help =
        "KV-cache blocks (full computed chunks) reported stored or removed, in the pool and the tiers below it.";
    m_kv_stored_ = &m.GetCounter("chunkattn_kv_event_blocks_total", blocks_help, {{"event", "stored"}});
    m_kv_removed_ = &m.GetCounter("chunkattn_kv_event_blocks_total", blocks_help, {{"event", "removed"}});
    m_kv_cleared_ = &m.GetCounter("chunkattn_kv_events_cleared_total", "AllBlocksCleared events published.");
  }
  if (!options_.kv_store_url.empty() && options_.scheduler.prefix_sharing) {
    // Checked with the flags (coordinator_config.cc); a bad URL here is a
    // caller's bug, and costs the shared tier, not the engine.
    absl::StatusOr<RedisUrl> url = ParseRedisUrl(options_.kv_store_url);
    if (url.ok()) {
      SharedKvProbeOptions po;
      po.url = *url;
      po.redis.connect_timeout = absl::Milliseconds(50);
      po.redis.io_timeout = absl::Milliseconds(50);
      po.redis.tls = options_.kv_store_tls;
      po.chunk_size = options_.scheduler.chunk_size;
      po.block_hash_seed = options_.kv_events_hash_seed;
      shared_probe_ = std::make_unique<SharedKvProbe>(po, [this](int64_t id, std::vector<uint64_t> keys) {
        Command c{Command::kTask, 0, 0, {}, nullptr, nullptr};
        c.task = [this, id, keys = std::move(keys)] {
          if (scheduler_ != nullptr) scheduler_->SharedProbeDone(id, keys);
        };
        Post(std::move(c));
      });
      Log(absl::StrCat("shared KV tier: ", url->Redacted()));
    } else {
      Log(absl::StrCat("shared KV tier off: ", url.status().ToString()));
    }
  }
  // A stop string found on the output thread ends the sample through the
  // inbox, like a cancel.
  output_ = std::make_unique<OutputProcessor>(tokenizer_, std::move(om), [this](int64_t id, int32_t index) {
    Command c{Command::kFinishSample, id, index, {}, nullptr, nullptr};
    Post(std::move(c));
  });
}

Engine::~Engine() { Stop(); }

void Engine::Stop() {
  stop_ = true;
  {
    absl::MutexLock lock(&inbox_mu_);
    inbox_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  output_->Stop();  // after the loop: its last EndAll is delivered
}

void Engine::Start() { thread_ = std::thread([this] { Loop(); }); }

void Engine::SetReadyCallback(std::function<void(bool)> callback) {
  absl::MutexLock lock(&inbox_mu_);
  ready_callback_ = std::move(callback);
}

void Engine::Post(Command command) {
  absl::MutexLock lock(&inbox_mu_);
  inbox_.push_back(std::move(command));
  inbox_cv_.Signal();
}

int64_t Engine::Submit(EngineRequest request, std::shared_ptr<ResponseSink> sink) {
  if (!draining_) {
    const int64_t id = next_id_++;
    absl::MutexLock lock(&inbox_mu_);
    if (!closed_) {
      inbox_.push_back(Command{Command::kSubmit, id, 0, std::move(request), std::move(sink), nullptr});
      inbox_cv_.Signal();
      return id;
    }
  }
  output_->Refuse(std::move(sink), absl::UnavailableError("the server is shutting down; retry on another replica"));
  return 0;
}

bool Engine::Drain(absl::Duration timeout) {
  draining_ = true;
  {
    absl::MutexLock lock(&inbox_mu_);
    auto quiet = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return idle_ && inbox_.empty(); };
    if (!inbox_mu_.AwaitWithTimeout(absl::Condition(&quiet), timeout)) return false;
  }
  // The loop is done; the output thread may still be sending the last
  // responses (found by the engine's TSan test).
  output_->Flush();
  return true;
}

void Engine::Cancel(int64_t id) { Post(Command{Command::kCancel, id, 0, {}, nullptr, nullptr}); }

void Engine::Abort(std::string owner, std::vector<std::string> request_ids,
                   std::function<void(std::vector<std::string>)> done) {
  // Through the inbox: a request submitted before this call has been opened
  // in the output processor by the time the lookup runs there.
  auto lookup = [this, owner = std::move(owner), ids = std::move(request_ids), done]() mutable {
    output_->FindOpen(std::move(owner), std::move(ids),
                      [this, done](std::vector<int64_t> engine_ids, std::vector<std::string> found) {
                        for (int64_t id : engine_ids) Post(Command{Command::kCancel, id, 1, {}, nullptr, nullptr});
                        done(std::move(found));
                      });
  };
  if (!PostTask(std::move(lookup))) done({});  // no loop would run it
}

bool Engine::PostTask(std::function<void()> task) {
  absl::MutexLock lock(&inbox_mu_);
  if (closed_) return false;
  inbox_.push_back(Command{Command::kTask, 0, 0, {}, nullptr, std::move(task)});
  inbox_cv_.Signal();
  return true;
}

void Engine::KvBlocks(std::function<void(absl::StatusOr<KvBlocksSnapshot>)> done) {
  if (options_.kv_events == nullptr) {
    done(absl::FailedPreconditionError("KV events are off (--kv_events)"));
    return;
  }
  auto take = [this, done] {
    PublishKvEvents();  // what the loop changed since its last step is in the stream first
    KvBlocksSnapshot snapshot;
    snapshot.next_seq = options_.kv_events->next_seq();
    if (scheduler_ != nullptr) snapshot.blocks = ListBlocks(scheduler_->forest(), options_.kv_events_hash_seed);
    done(std::move(snapshot));
  };
  if (!PostTask(std::move(take))) done(absl::UnavailableError("the coordinator is shutting down"));
}

void Engine::PublishKvEvents() {
  if (kv_tracker_ == nullptr || scheduler_ == nullptr) return;
  const absl::Time start = absl::Now();
  std::vector<KvEvent> events;
  // The tiers' first: a block the pool evicted into a tier is then stored
  // there before it is removed from the pool, so a router counting it in any
  // medium never sees it gone.
  for (const KvTierEvent& t : scheduler_->TakeTierEvents()) {
    const KvEvent::Kind kind = t.stored ? KvEvent::Kind::kBlockStored : KvEvent::Kind::kBlockRemoved;
    const int tier = static_cast<int>(t.tier);
    if (events.empty() || events.back().kind != kind || events.back().tier != tier) {
      KvEvent e;
      e.kind = kind;
      e.tier = tier;
      if (t.stored) e.block_size = options_.scheduler.chunk_size;
      events.push_back(std::move(e));
    }
    events.back().block_hashes.push_back(t.key);
  }
  kv_tracker_->Convert(scheduler_->TakeBlockEvents(), &events);
  CountAndPublish(std::move(events), start);
}

void Engine::ClearKvEvents() {
  if (kv_tracker_ == nullptr) return;
  const absl::Time start = absl::Now();
  std::vector<KvEvent> events;
  kv_tracker_->Clear(&events);
  CountAndPublish(std::move(events), start);
}

void Engine::CountAndPublish(std::vector<KvEvent> events, absl::Time start) {
  if (events.empty()) return;
  for (const KvEvent& e : events) {
    const double blocks = static_cast<double>(e.block_hashes.size());
    switch (e.kind) {
      case KvEvent::Kind::kBlockStored:
        m_kv_stored_->Increment(blocks);
        break;
      case KvEvent::Kind::kBlockRemoved:
        m_kv_removed_->Increment(blocks);
        break;
      case KvEvent::Kind::kAllBlocksCleared:
        m_kv_cleared_->Increment();
        break;
    }
  }
  m_kv_batches_->Increment();
  options_.kv_events->Publish(std::move(events));
  m_kv_publish_seconds_->Increment(absl::ToDoubleSeconds(absl::Now() - start));
}

void Engine::ResetPeaks() { Post(Command{Command::kResetPeaks, 0, 0, {}, nullptr, nullptr}); }

Engine::Snapshot Engine::snapshot() const {
  Snapshot s;
  {
    absl::MutexLock lock(&snapshot_mu_);
    s = snapshot_;
  }
  // Read now, not at the loop's last update: the output thread counts a
  // token before its response is sent, so a client that has its response
  // sees it counted. Counters hold integers well below 2^53: exact as doubles.
  s.prompt_tokens_total = static_cast<int64_t>(m_prompt_tokens_->value());
  s.cached_prompt_tokens_total = static_cast<int64_t>(m_prompt_cached_->value());
  s.generation_tokens_total = static_cast<int64_t>(m_generation_tokens_->value());
  return s;
}

void Engine::Loop() {
  std::string last_error;
  while (!stop_) {
    if (!ready_) {
      absl::Status s = pool_->Connect();
      if (s.ok()) {
        SchedulerOptions so = options_.scheduler;
        so.defer_masks = true;  // Step() sends them while the workers run the forward pass
        so.mask_pool = &mask_pool_;
        // The workers' tiers are new with their session: so is the map.
        so.tiers.host_slots = pool_->host_kv_slots();
        so.tiers.disk_slots = pool_->disk_kv_slots();
        so.tiers.shared = shared_probe_ != nullptr && !pool_->kv_store_key_prefixes().empty();
        if (shared_probe_ != nullptr) shared_probe_->SetKeyPrefixes(pool_->kv_store_key_prefixes());
        so.block_hash_seed = options_.kv_events_hash_seed;
        so.record_block_events = options_.kv_events != nullptr;
        so.tiers.record_events = options_.kv_events != nullptr;
        so.num_chunks = static_cast<int32_t>(std::min<int64_t>(pool_->num_chunks(), kMaxChunks));
        absl::StatusOr<std::unique_ptr<Scheduler>> scheduler = Scheduler::Create(so);
        if (!scheduler.ok()) {
          s = scheduler.status();
          pool_->Disconnect();
        } else {
          scheduler_ = std::move(*scheduler);
        }
      }
      if (!s.ok()) {
        if (s.ToString() != last_error) Log(absl::StrCat("waiting for the workers: ", s.ToString()));
        last_error = s.ToString();
        DrainInbox(false);
        absl::MutexLock lock(&inbox_mu_);
        // Everything in flight was failed when the workers went, but for the
        // queue a draining worker left (it runs once they are back).
        idle_ = held_.empty();
        if (inbox_.empty() && !stop_) inbox_cv_.WaitWithTimeout(&inbox_mu_, options_.reconnect_interval);
        continue;
      }
      last_error.clear();
      Log(absl::StrFormat("%d worker(s) joined: KV pool of %d chunks (%d bytes each over all ranks)",
                          pool_->world_size(), scheduler_->options().num_chunks, pool_->chunk_bytes_total()));
      // Requests queued when the last workers left, in their order.
      for (auto& [id, spec] : std::exchange(held_, {})) {
        if (absl::Status added = scheduler_->Add(id, std::move(spec)); !added.ok()) {
          output_->End(id, added, "error");
        }
      }
      m_chunk_bytes_->Set(static_cast<double>(pool_->chunk_bytes_total()));
      // vLLM's info series, with the chunk as the block: 1 for this session's
      // pool, 0 for an earlier one of another size.
      metrics::Gauge* config = &metrics_->GetGauge(
          "vllm:cache_config_info", "The KV cache's configuration (vLLM's info series; block = chunk).",
          {{"block_size", std::to_string(options_.scheduler.chunk_size)},
           {"num_gpu_blocks", std::to_string(scheduler_->options().num_chunks)},
           {"cache_dtype", pool_->kv_dtype()},
           {"enable_prefix_caching", options_.scheduler.prefix_sharing ? "True" : "False"}});
      if (m_vllm_cache_config_ != nullptr && m_vllm_cache_config_ != config) m_vllm_cache_config_->Set(0);
      m_vllm_cache_config_ = config;
      config->Set(1);
      ClearKvEvents();  // a new pool: whatever a router indexed for this replica is gone
      SetReady(true);
      UpdateGauges();
    }
    DrainInbox(true);
    if (!pool_->draining().empty()) {
      // A worker is shutting down: nothing new starts; once nothing runs
      // the workers are released and the queue waits for them to re-join.
      if (scheduler_->num_started() == 0) {
        ReleaseWorkers();
        continue;
      }
      scheduler_->set_admitting(false);
    }
    if (scheduler_->HasWork()) {
      Step();
    } else {
      // Idle, no step would notice a worker lost or shutting down: probe.
      if (const absl::Time now = absl::Now(); now >= next_probe_) {
        next_probe_ = now + kIdleProbeInterval;
        if (absl::Status alive = pool_->Probe(); !alive.ok()) {
          Log(alive.ToString());
          FailAll(alive);
          continue;
        }
      }
      absl::MutexLock lock(&inbox_mu_);
      idle_ = true;
      if (inbox_.empty() && !stop_) inbox_cv_.WaitWithTimeout(&inbox_mu_, absl::Milliseconds(200));
    }
  }
  FailAll(absl::UnavailableError("the coordinator is shutting down"));
  {
    absl::MutexLock lock(&inbox_mu_);
    closed_ = true;  // a later Submit is refused at once: no loop would run it
  }
  DrainInbox(false);
}

void Engine::DrainInbox(bool serving) {
  std::deque<Command> commands;
  {
    absl::MutexLock lock(&inbox_mu_);
    commands.swap(inbox_);
    if (!commands.empty()) idle_ = false;
  }
  for (Command& c : commands) {
    if (c.kind == Command::kResetPeaks) {
      if (scheduler_ != nullptr) scheduler_->ResetPeaks();
      continue;
    }
    if (c.kind == Command::kFinishSample) {
      if (scheduler_ != nullptr) scheduler_->FinishSample(c.id, c.index);
      continue;
    }
    if (c.kind == Command::kCancel) {
      if (scheduler_ != nullptr) scheduler_->Abort(c.id);
      held_.erase(std::remove_if(held_.begin(), held_.end(), [&](const auto& h) { return h.first == c.id; }),
                  held_.end());
      absl::Status cancelled = absl::CancelledError(c.index == 1 ? "aborted by an Abort call" : "cancelled by the client");
      if (c.index == 1) cancelled.SetPayload(kAbortedPayload, absl::Cord("1"));
      output_->End(c.id, cancelled, "cancelled");
      continue;
    }
    if (c.kind == Command::kTask) {
      c.task();
      continue;
    }
    if (!serving) {
      output_->Refuse(std::move(c.sink), absl::UnavailableError("the workers are not ready; retry later"));
      continue;
    }
    const int64_t waiting = scheduler_->num_waiting();
    if (options_.max_waiting_requests > 0 && waiting >= options_.max_waiting_requests) {
      output_->Refuse(std::move(c.sink),
                      absl::ResourceExhaustedError(absl::StrFormat(
                          "the queue is full: %d requests waiting (--max_waiting_requests); retry later", waiting)));
      continue;
    }
    OutputProcessor::Request out;
    out.id = c.id;
    out.request_id = std::move(c.request.request_id);
    c.request.spec.tenant = c.request.owner;  // the scheduler's fair-share unit
    out.owner = std::move(c.request.owner);
    out.stops = std::move(c.request.stop_strings);
    out.min_tokens = c.request.spec.min_tokens;
    out.return_logprobs = c.request.spec.sampling.return_logprobs;
    out.n = c.request.spec.n;
    if (tokenizer_ != nullptr) out.prompt = c.request.spec.prompt;
    out.arrival = absl::Now();
    const bool probe = shared_probe_ != nullptr && scheduler_->tiers().shared();
    std::vector<TokenId> probe_prompt = probe ? c.request.spec.prompt : std::vector<TokenId>();
    std::string probe_ns = probe ? c.request.spec.cache_namespace : std::string();
    absl::Status added = scheduler_->Add(c.id, std::move(c.request.spec));
    if (!added.ok()) {
      output_->Refuse(std::move(c.sink), added);
      continue;
    }
    if (probe) {
      scheduler_->AwaitSharedProbe(c.id, kSharedProbeWait);
      shared_probe_->Probe(c.id, std::move(probe_prompt), std::move(probe_ns));
    }
    output_->Open(std::move(out), std::move(c.sink));
  }
  if (serving) {
    UpdateGauges();
    PublishKvEvents();  // a cancelled prefill's chunks, an eviction by EvictCached
  }
}

void Engine::Step() {
  StepPlan plan;
  absl::StatusOr<bool> scheduled = scheduler_->Schedule(&plan);
  if (!scheduled.ok()) {
    Log(absl::StrCat("scheduler: ", scheduled.status().ToString()));
    FailAll(absl::InternalError(absl::StrCat("scheduler: ", scheduled.status().message())));
    return;
  }
  if (!*scheduled) {
    absl::MutexLock lock(&inbox_mu_);
    if (inbox_.empty() && !stop_) inbox_cv_.WaitWithTimeout(&inbox_mu_, absl::Milliseconds(20));
    return;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<StepResult> result = pool_->Step(&plan, [this](StepPlan* p) { scheduler_->FillMasks(p); });
  const absl::Time now = absl::Now();
  if (!result.ok()) {
    Log(result.status().ToString());
    FailAll(absl::UnavailableError(result.status().message()));
    return;
  }
  m_step_->Observe(absl::ToDoubleSeconds(now - start));
  if (std::any_of(plan.moves.begin(), plan.moves.end(), [](const KvMove& m) {
        return m.tier == KvTier::kShared && m.kind == KvMove::Kind::kLoad;
      })) {
    m_shared_load_seconds_->Observe(result->shared_load_seconds);
    shared_load_seconds_ += result->shared_load_seconds;
  }
  std::vector<SampleEvent> events;
  absl::Status completed = scheduler_->Complete(*result, &events);
  if (!completed.ok()) {
    Log(absl::StrCat("scheduler: ", completed.ToString()));
    FailAll(absl::InternalError(absl::StrCat("scheduler: ", completed.message())));
    return;
  }
  UpdateGauges();  // first: a client that has its last response sees the step's stats
  output_->Events(std::move(events), now);
  PublishKvEvents();
}

void Engine::FailAll(const absl::Status& status) {
  output_->EndAll(status);
  held_.clear();
  EndSession();
}

void Engine::ReleaseWorkers() {
  held_ = scheduler_->TakeQueued();
  Log(absl::StrFormat("worker %s is shutting down: releasing the workers; %d queued request(s) wait for them to "
                      "re-join",
                      pool_->draining(), held_.size()));
  m_running_->Set(0);
  m_waiting_->Set(static_cast<double>(held_.size()));
  EndSession();  // closing the streams lets the draining worker exit
}

void Engine::EndSession() {
  if (scheduler_ != nullptr) {
    PublishKvEvents();
    ClearKvEvents();  // the workers' pools are gone with the session
  }
  scheduler_.reset();
  evictions_seen_ = 0;
  tiers_seen_ = KvTierStats();
  band_evictions_seen_ = {};
  retention_capped_seen_ = 0;
  shared_load_seconds_ = 0;
  preemptions_seen_ = 0;
  pool_->Disconnect();
  SetReady(false);
}

void Engine::SetReady(bool ready) {
  if (ready_ == ready) return;
  ready_ = ready;
  m_workers_ready_->Set(ready ? 1 : 0);
  std::function<void(bool)> callback;
  {
    absl::MutexLock lock(&inbox_mu_);
    callback = ready_callback_;
  }
  if (callback) callback(ready);
}

void Engine::UpdateGauges() {
  if (scheduler_ == nullptr) return;
  const CacheStats cs = scheduler_->cache_stats();
  const SchedulerStats ss = scheduler_->stats();
  m_chunks_used_->Set(cs.used_chunks);
  m_chunks_cached_->Set(cs.cached_chunks);
  m_chunks_free_->Set(cs.free_chunks);
  m_shared_chunks_->Set(cs.shared_chunks);
  m_logical_tokens_->Set(static_cast<double>(cs.logical_tokens));
  m_physical_tokens_->Set(static_cast<double>(cs.physical_tokens));
  m_oldest_cached_->Set(cs.oldest_cached_seconds);
  if (cs.total_evictions > evictions_seen_) m_evicted_->Increment(static_cast<double>(cs.total_evictions - evictions_seen_));
  evictions_seen_ = cs.total_evictions;
  const KvTierStats& ts = scheduler_->tiers().stats();
  m_host_tier_.blocks->Set(static_cast<double>(ts.host_blocks));
  m_disk_tier_.blocks->Set(static_cast<double>(ts.disk_blocks));
  m_host_tier_.slots->Set(static_cast<double>(scheduler_->options().tiers.host_slots));
  m_disk_tier_.slots->Set(static_cast<double>(scheduler_->options().tiers.disk_slots));
  auto count = [](metrics::Counter* c, int64_t now, int64_t* seen) {
    if (now > *seen) c->Increment(static_cast<double>(now - *seen));
    *seen = now;
  };
  count(m_host_tier_.loads, ts.host_loads_total, &tiers_seen_.host_loads_total);
  count(m_disk_tier_.loads, ts.disk_loads_total, &tiers_seen_.disk_loads_total);
  count(m_tier_stores_, ts.stores_total, &tiers_seen_.stores_total);
  for (int b = 0; b < kNumRetentionBands; ++b) {
    m_band_chunks_[b]->Set(cs.band_chunks[b]);
    count(m_band_evictions_[b], cs.band_evictions_total[b], &band_evictions_seen_[b]);
    count(m_band_tier_drops_[b], ts.drops_by_band_total[b], &tiers_seen_.drops_by_band_total[b]);
  }
  count(m_retention_capped_, ss.retention_capped_chunks, &retention_capped_seen_);
  count(m_tier_demotions_, ts.demotions_total, &tiers_seen_.demotions_total);
  count(m_tier_drops_, ts.drops_total, &tiers_seen_.drops_total);
  count(m_tier_failed_, ts.failed_moves_total, &tiers_seen_.failed_moves_total);
  m_shared_known_->Set(static_cast<double>(ts.shared_known));
  count(m_shared_loads_, ts.shared_loads_total, &tiers_seen_.shared_loads_total);
  count(m_shared_stores_, ts.shared_stores_total, &tiers_seen_.shared_stores_total);
  count(m_shared_hits_, ts.shared_hits_total, &tiers_seen_.shared_hits_total);
  count(m_shared_fallbacks_, ts.shared_fallbacks_total, &tiers_seen_.shared_fallbacks_total);
  count(m_shared_failed_stores_, ts.shared_failed_stores_total, &tiers_seen_.shared_failed_stores_total);
  if (shared_probe_ != nullptr) {  // the probe's totals span sessions
    const SharedKvProbeStats ps = shared_probe_->stats();
    count(m_shared_probes_, ps.probes_total, &probes_seen_.probes_total);
    count(m_shared_probe_failures_, ps.failed_total, &probes_seen_.failed_total);
  }
  if (ss.preemptions_total > preemptions_seen_) {
    m_preemptions_->Increment(static_cast<double>(ss.preemptions_total - preemptions_seen_));
  }
  preemptions_seen_ = ss.preemptions_total;
  m_running_->Set(static_cast<double>(ss.running_requests));
  m_waiting_->Set(static_cast<double>(ss.waiting_requests));
  // Per tenant: at most every kTenantGaugePeriod while the same requests
  // run, and at once when one starts or ends (a client holding its last
  // response sees its tenant's figures).
  const absl::Time now = absl::Now();
  const std::pair<int64_t, int64_t> totals{ss.running_requests, ss.waiting_requests};
  if (totals != tenant_gauges_totals_ || now - tenant_gauges_at_ >= kTenantGaugePeriod) {
    tenant_gauges_totals_ = totals;
    tenant_gauges_at_ = now;
    UpdateTenantGauges(cs);
  }
  m_vllm_running_->Set(static_cast<double>(ss.running_requests));
  m_vllm_waiting_->Set(static_cast<double>(ss.waiting_requests));
  const double usage = cs.kv_usage();
  m_vllm_kv_usage_->Set(usage);
  m_vllm_gpu_cache_usage_->Set(usage);
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_.num_chunks = scheduler_->options().num_chunks;
  snapshot_.chunk_bytes_total = pool_->chunk_bytes_total();
  snapshot_.dtype = pool_->dtype();
  snapshot_.device = pool_->device();
  snapshot_.kv_dtype = pool_->kv_dtype();
  snapshot_.cache = cs;
  snapshot_.scheduler = ss;
  snapshot_.tiers = TierSnapshots(ts, scheduler_->options().tiers);
}

std::vector<Engine::TierSnapshot> Engine::TierSnapshots(const KvTierStats& ts, const KvTierMapOptions& o) const {
  std::vector<TierSnapshot> out;
  if (o.host_slots > 0) {
    TierSnapshot& t = out.emplace_back();
    t.tier = KvTier::kHost;
    t.blocks = ts.host_blocks;
    t.capacity_blocks = o.host_slots;
    t.hits_total = t.loads_total = ts.host_loads_total;
    t.stores_total = ts.host_written_total;
    t.fallbacks_total = ts.host_failed_moves_total;
    t.drops_total = ts.host_drops_total;
  }
  if (o.disk_slots > 0) {
    TierSnapshot& t = out.emplace_back();
    t.tier = KvTier::kDisk;
    t.blocks = ts.disk_blocks;
    t.capacity_blocks = o.disk_slots;
    t.hits_total = t.loads_total = ts.disk_loads_total;
    t.stores_total = ts.disk_written_total;
    t.fallbacks_total = ts.failed_moves_total - ts.host_failed_moves_total;
    t.drops_total = ts.drops_total - ts.host_drops_total;
  }
  if (o.shared) {
    TierSnapshot& t = out.emplace_back();
    t.tier = KvTier::kShared;
    t.blocks = ts.shared_known;
    t.hits_total = ts.shared_hits_total;
    t.loads_total = ts.shared_loads_total;
    t.load_seconds_total = shared_load_seconds_;
    t.stores_total = ts.shared_stores_total;
    t.fallbacks_total = ts.shared_fallbacks_total + ts.shared_failed_stores_total;
  }
  return out;
}

void Engine::UpdateTenantGauges(const CacheStats& cs) {
  // The label values are the token file's tenants (one, "",
  // without tokens), so the series stay few. A tenant gone idle reads 0.
  const std::map<std::string, TenantLoad> loads = scheduler_->tenant_loads();
  for (const auto& [tenant, load] : loads) {
    if (tenant_gauges_.count(tenant) > 0) continue;
    tenant_gauges_[tenant] = {
        &metrics_->GetGauge("chunkattn_tenant_requests", "Requests running or waiting, per tenant.",
                            {{"tenant", tenant}, {"state", "running"}}),
        &metrics_->GetGauge("chunkattn_tenant_requests", "Requests running or waiting, per tenant.",
                            {{"tenant", tenant}, {"state", "waiting"}}),
        &metrics_->GetGauge("chunkattn_tenant_running_sequences",
                            "Live samples of the running requests, per tenant.", {{"tenant", tenant}}),
        &metrics_->GetGauge("chunkattn_tenant_kv_chunks",
                            "KV chunks (in use or cached) in the tenant's cache namespaces.", {{"tenant", tenant}}),
        &metrics_->GetGauge("chunkattn_tenant_kv_retained_chunks",
                            "KV chunks of the tenant above the default retention priority, in the pool and "
                            "the KV tiers (bounded by --max_retained_chunks_per_tenant).",
                            {{"tenant", tenant}})};
  }
  // Chunks per tenant (base/tenant_namespace.h); without tokens the one
  // tenant "" owns every namespace.
  std::map<std::string, int64_t, std::less<>> ns_chunks, ns_raised;
  for (const auto& [ns, chunks] : scheduler_->forest().ChunksPerNamespace()) {
    ns_chunks[std::string(NamespaceTenant(ns))] += chunks;
  }
  int64_t all_raised = 0;
  for (const auto& [ns, chunks] : scheduler_->RaisedPerNamespace()) {
    ns_raised[std::string(NamespaceTenant(ns))] += chunks;
    all_raised += chunks;
  }
  for (const auto& [tenant, gauges] : tenant_gauges_) {
    auto it = loads.find(tenant);
    const TenantLoad load = it == loads.end() ? TenantLoad{} : it->second;
    gauges[0]->Set(static_cast<double>(load.running_requests));
    gauges[1]->Set(static_cast<double>(load.waiting_requests));
    gauges[2]->Set(static_cast<double>(load.running_sequences));
    int64_t chunks = 0;
    if (tenant.empty()) {
      chunks = cs.used_chunks + cs.cached_chunks;
    } else if (auto c = ns_chunks.find(tenant); c != ns_chunks.end()) {
      chunks = c->second;
    }
    gauges[3]->Set(static_cast<double>(chunks));
    int64_t raised = tenant.empty() ? all_raised : 0;
    if (auto r = ns_raised.find(tenant); !tenant.empty() && r != ns_raised.end()) raised = r->second;
    gauges[4]->Set(static_cast<double>(raised));
  }
}

}  // namespace chunkattn
