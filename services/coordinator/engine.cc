#include "services/coordinator/engine.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "text/detokenizer.h"

namespace chunkattn {

namespace {

void Log(const std::string& message) {
  std::fprintf(stderr, "%s coordinator: %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%E3S", absl::Now(), absl::UTCTimeZone()).c_str(),
               message.c_str());
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStopToken:
      return v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

const char* ReasonLabel(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kNone:
      break;
  }
  return "error";
}

// Latency buckets, seconds: 1 ms .. ~65 s.
std::vector<double> LatencyBuckets() { return metrics::ExponentialBuckets(0.001, 2, 17); }

}  // namespace

struct Engine::Live {
  int64_t id = 0;
  std::string request_id;
  std::shared_ptr<ResponseSink> sink;
  std::vector<std::string> stops;
  bool return_logprobs = false;
  absl::Time arrival;
  bool first_token = false;
  FinishReason last_reason = FinishReason::kNone;
  struct Sample {
    std::unique_ptr<IncrementalDetokenizer> detok;
    std::string text;  // decoded so far
    size_t sent = 0;   // bytes of text sent
    bool finished = false;
    bool has_token = false;
    absl::Time last_token;
  };
  std::vector<Sample> samples;
};

Engine::Engine(EngineOptions options, const ModelConfig* config, const Tokenizer* tokenizer,
               metrics::Registry* metrics)
    : options_(std::move(options)), config_(config), tokenizer_(tokenizer), metrics_(metrics) {
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
  m_oldest_cached_ = &m.GetGauge("chunkattn_kv_oldest_cached_seconds",
                                 "Since the next KV chunk to evict lost its last user (0: none cached).");
  const std::string req_help = "Requests by state.";
  m_running_ = &m.GetGauge("chunkattn_requests", req_help, {{"state", "running"}});
  m_waiting_ = &m.GetGauge("chunkattn_requests", req_help, {{"state", "waiting"}});
  const std::string fin_help = "Finished requests by reason.";
  for (const char* reason : {"length", "stop_token", "stop_string", "cancelled", "error"}) {
    m_finished_[reason] = &m.GetCounter("chunkattn_requests_finished_total", fin_help, {{"reason", reason}});
  }
  m_preemptions_ = &m.GetCounter("chunkattn_preemptions_total", "Requests preempted for memory (recomputed later).");
  m_workers_ready_ = &m.GetGauge("chunkattn_workers_ready", "1 when every worker is joined and serving.");
  m_ttft_ = &m.GetHistogram("chunkattn_time_to_first_token_seconds", "Arrival to first token.", LatencyBuckets());
  m_itl_ = &m.GetHistogram("chunkattn_inter_token_latency_seconds", "Between two tokens of a sample.",
                           LatencyBuckets());
  m_duration_ = &m.GetHistogram("chunkattn_request_duration_seconds", "Arrival to the last token.",
                                LatencyBuckets());
  m_step_ = &m.GetHistogram("chunkattn_step_duration_seconds", "One iteration on the workers.", LatencyBuckets());
  pool_ = std::make_unique<WorkerPool>(options_.workers);
}

Engine::~Engine() { Stop(); }

void Engine::Stop() {
  stop_ = true;
  {
    absl::MutexLock lock(&inbox_mu_);
    inbox_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void Engine::Start() { thread_ = std::thread([this] { Loop(); }); }

void Engine::SetReadyCallback(std::function<void(bool)> callback) {
  absl::MutexLock lock(&inbox_mu_);
  ready_callback_ = std::move(callback);
}

int64_t Engine::Submit(EngineRequest request, std::shared_ptr<ResponseSink> sink) {
  const int64_t id = next_id_++;
  absl::MutexLock lock(&inbox_mu_);
  Command c{Command::kSubmit, id, std::move(request), std::move(sink)};
  inbox_.push_back(std::move(c));
  inbox_cv_.Signal();
  return id;
}

void Engine::Cancel(int64_t id) {
  absl::MutexLock lock(&inbox_mu_);
  Command c{Command::kCancel, id, {}, nullptr};
  inbox_.push_back(std::move(c));
  inbox_cv_.Signal();
}

void Engine::ResetPeaks() {
  absl::MutexLock lock(&inbox_mu_);
  inbox_.push_back(Command{Command::kResetPeaks, 0, {}, nullptr});
  inbox_cv_.Signal();
}

Engine::Snapshot Engine::snapshot() const {
  absl::MutexLock lock(&snapshot_mu_);
  return snapshot_;
}

void Engine::Loop() {
  std::string last_error;
  while (!stop_) {
    if (!ready_) {
      absl::Status s = pool_->Connect();
      if (s.ok()) {
        SchedulerOptions so = options_.scheduler;
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
        if (inbox_.empty() && !stop_) inbox_cv_.WaitWithTimeout(&inbox_mu_, options_.reconnect_interval);
        continue;
      }
      last_error.clear();
      Log(absl::StrFormat("%d worker(s) joined: KV pool of %d chunks (%d bytes each over all ranks)",
                          pool_->world_size(), scheduler_->options().num_chunks, pool_->chunk_bytes_total()));
      ready_ = true;
      m_workers_ready_->Set(1);
      m_chunk_bytes_->Set(static_cast<double>(pool_->chunk_bytes_total()));
      UpdateGauges();
      std::function<void(bool)> callback;
      {
        absl::MutexLock lock(&inbox_mu_);
        callback = ready_callback_;
      }
      if (callback) callback(true);
    }
    DrainInbox(true);
    if (scheduler_->HasWork()) {
      Step();
    } else {
      absl::MutexLock lock(&inbox_mu_);
      if (inbox_.empty() && !stop_) inbox_cv_.WaitWithTimeout(&inbox_mu_, absl::Milliseconds(200));
    }
  }
  FailAll(absl::UnavailableError("the coordinator is shutting down"));
  DrainInbox(false);
}

void Engine::DrainInbox(bool serving) {
  std::deque<Command> commands;
  {
    absl::MutexLock lock(&inbox_mu_);
    commands.swap(inbox_);
  }
  for (Command& c : commands) {
    if (c.kind == Command::kResetPeaks) {
      if (scheduler_ != nullptr) scheduler_->ResetPeaks();
      continue;
    }
    if (c.kind == Command::kCancel) {
      if (live_.count(c.id) == 0) continue;
      if (scheduler_ != nullptr) scheduler_->Abort(c.id);
      EndRequest(c.id, absl::CancelledError("cancelled by the client"), "cancelled");
      continue;
    }
    if (!serving) {
      c.sink->Finish(absl::UnavailableError("the workers are not ready; retry later"));
      continue;
    }
    const int n = c.request.spec.n;
    const bool return_logprobs = c.request.spec.sampling.return_logprobs;
    std::vector<int32_t> prompt = c.request.spec.prompt;
    absl::Status added = scheduler_->Add(c.id, std::move(c.request.spec));
    if (!added.ok()) {
      c.sink->Finish(added);
      continue;
    }
    auto live = std::make_unique<Live>();
    live->id = c.id;
    live->request_id = std::move(c.request.request_id);
    live->sink = std::move(c.sink);
    live->stops = std::move(c.request.stop_strings);
    live->return_logprobs = return_logprobs;
    live->arrival = absl::Now();
    live->samples.resize(n);
    if (tokenizer_ != nullptr) {
      for (auto& s : live->samples) s.detok = std::make_unique<IncrementalDetokenizer>(tokenizer_, prompt);
    }
    live_[c.id] = std::move(live);
  }
  if (serving) UpdateGauges();
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
  absl::StatusOr<StepResult> result = pool_->Step(plan);
  const absl::Time now = absl::Now();
  if (!result.ok()) {
    Log(result.status().ToString());
    FailAll(absl::UnavailableError(result.status().message()));
    return;
  }
  m_step_->Observe(absl::ToDoubleSeconds(now - start));
  std::vector<SampleEvent> events;
  absl::Status completed = scheduler_->Complete(*result, &events);
  if (!completed.ok()) {
    Log(absl::StrCat("scheduler: ", completed.ToString()));
    FailAll(absl::InternalError(absl::StrCat("scheduler: ", completed.message())));
    return;
  }
  std::vector<int64_t> touched;
  for (const SampleEvent& e : events) {
    HandleEvent(e, now);
    touched.push_back(e.request);
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (int64_t id : touched) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    const auto& samples = it->second->samples;
    if (std::all_of(samples.begin(), samples.end(), [](const Live::Sample& s) { return s.finished; })) {
      EndRequest(id, absl::OkStatus(), ReasonLabel(it->second->last_reason));
    }
  }
  UpdateGauges();
}

void Engine::HandleEvent(const SampleEvent& e, absl::Time now) {
  auto it = live_.find(e.request);
  if (it == live_.end()) return;
  Live& live = *it->second;
  Live::Sample& sample = live.samples[e.index];
  if (!live.first_token) {
    live.first_token = true;
    m_ttft_->Observe(absl::ToDoubleSeconds(now - live.arrival));
    m_prompt_tokens_->Increment(e.prompt_tokens);
    m_prompt_cached_->Increment(e.cached_prompt_tokens);
  }
  if (sample.has_token) m_itl_->Observe(absl::ToDoubleSeconds(now - sample.last_token));
  sample.has_token = true;
  sample.last_token = now;
  m_generation_tokens_->Increment();

  if (sample.detok != nullptr) {
    absl::StatusOr<std::string> delta = sample.detok->Append(e.token);
    if (delta.ok()) sample.text += *delta;
  }
  FinishReason finish = e.finish;
  // Stop strings: the earliest match ends the text before it. Text that
  // could still become a match is held back until it cannot.
  size_t end = sample.text.size();
  size_t earliest = std::string::npos;
  for (const std::string& stop : live.stops) {
    const size_t from = sample.sent >= stop.size() ? sample.sent - stop.size() + 1 : 0;
    const size_t pos = sample.text.find(stop, from);
    if (pos != std::string::npos && pos < earliest) earliest = pos;
  }
  if (earliest != std::string::npos) {
    finish = FinishReason::kStopString;
    end = std::max(earliest, sample.sent);
  } else if (finish != FinishReason::kNone) {
    if (sample.detok != nullptr) {
      absl::StatusOr<std::string> rest = sample.detok->Flush();
      if (rest.ok()) sample.text += *rest;
    }
    end = sample.text.size();
  } else {
    size_t hold = 0;
    for (const std::string& stop : live.stops) {
      for (size_t k = std::min(stop.size() - 1, sample.text.size() - sample.sent); k > hold; --k) {
        if (sample.text.compare(sample.text.size() - k, k, stop, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    end = sample.text.size() - hold;
  }
  v1::GenerateResponse response;
  response.set_request_id(live.request_id);
  response.set_index(static_cast<uint32_t>(e.index));
  response.add_token_ids(e.token);
  if (end > sample.sent) {
    response.set_text(sample.text.substr(sample.sent, end - sample.sent));
    sample.sent = end;
  }
  if (live.return_logprobs) response.add_logprobs(e.logprob);
  if (finish != FinishReason::kNone) {
    sample.finished = true;
    live.last_reason = finish;
    response.set_finish_reason(ToProto(finish));
    auto* usage = response.mutable_usage();
    usage->set_prompt_tokens(static_cast<uint32_t>(e.prompt_tokens));
    usage->set_cached_prompt_tokens(static_cast<uint32_t>(e.cached_prompt_tokens));
    usage->set_completion_tokens(static_cast<uint32_t>(e.completion_tokens));
    if (finish == FinishReason::kStopString) scheduler_->FinishSample(e.request, e.index);
  }
  live.sink->Send(std::move(response));
}

void Engine::EndRequest(int64_t id, const absl::Status& status, const std::string& reason) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  m_finished_.at(reason)->Increment();
  m_duration_->Observe(absl::ToDoubleSeconds(absl::Now() - it->second->arrival));
  it->second->sink->Finish(status);
  live_.erase(it);
}

void Engine::FailAll(const absl::Status& status) {
  std::vector<int64_t> ids;
  for (const auto& [id, live] : live_) ids.push_back(id);
  for (int64_t id : ids) EndRequest(id, status, "error");
  scheduler_.reset();
  evictions_seen_ = 0;
  preemptions_seen_ = 0;
  pool_->Disconnect();
  if (ready_) {
    ready_ = false;
    m_workers_ready_->Set(0);
    std::function<void(bool)> callback;
    {
      absl::MutexLock lock(&inbox_mu_);
      callback = ready_callback_;
    }
    if (callback) callback(false);
  }
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
  if (ss.preemptions_total > preemptions_seen_) {
    m_preemptions_->Increment(static_cast<double>(ss.preemptions_total - preemptions_seen_));
  }
  preemptions_seen_ = ss.preemptions_total;
  m_running_->Set(static_cast<double>(ss.running_requests));
  m_waiting_->Set(static_cast<double>(ss.waiting_requests));
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_.num_chunks = scheduler_->options().num_chunks;
  snapshot_.chunk_bytes_total = pool_->chunk_bytes_total();
  snapshot_.dtype = pool_->dtype();
  snapshot_.device = pool_->device();
  snapshot_.kv_dtype = pool_->kv_dtype();
  snapshot_.cache = cs;
  snapshot_.scheduler = ss;
  // Counters hold integers well below 2^53: exact as doubles.
  snapshot_.prompt_tokens_total = static_cast<int64_t>(m_prompt_tokens_->value());
  snapshot_.cached_prompt_tokens_total = static_cast<int64_t>(m_prompt_cached_->value());
  snapshot_.generation_tokens_total = static_cast<int64_t>(m_generation_tokens_->value());
}

}  // namespace chunkattn
