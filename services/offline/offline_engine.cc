#include "services/offline/offline_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace chunkattn {

absl::StatusOr<std::unique_ptr<OfflineEngine>> OfflineEngine::Create(Model* model, OfflineEngineOptions options) {
  const ModelConfig& config = model->config();
  SchedulerOptions so;
  so.chunk_size = model->options().chunk_size;
  so.num_chunks = static_cast<int32_t>(model->options().num_kv_chunks);
  so.max_context = config.max_context;
  so.max_batch_size = options.max_batch_size;
  so.max_tokens_per_step = options.max_tokens_per_step;
  so.prefix_sharing = options.prefix_sharing;
  so.eos_token_ids = config.eos_token_ids;
  std::unique_ptr<KvTierStore> tiers;
  if (options.tiers.host_bytes > 0 || !options.tiers.disk_dir.empty()) {
    ASSIGN_OR_RETURN(tiers, KvTierStore::Create(options.tiers, model->kv_chunk_bytes(), options.host_allocator));
    so.tiers.host_slots = tiers->slots(KvTier::kHost);
    so.tiers.disk_slots = tiers->slots(KvTier::kDisk);
    so.tier_write_through = options.tier_write_through;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, Scheduler::Create(so));
  return std::unique_ptr<OfflineEngine>(new OfflineEngine(model, std::move(scheduler), std::move(tiers)));
}

OfflineEngine::OfflineEngine(Model* model, std::unique_ptr<Scheduler> scheduler, std::unique_ptr<KvTierStore> tiers)
    : model_(model),
      scheduler_(std::move(scheduler)),
      tiers_(std::move(tiers)),
      executor_(model, /*samples=*/true, tiers_.get()) {}

void OfflineEngine::set_logits_observer(LogitsObserver observer) {
  observer_ = std::move(observer);
  executor_.set_keep_logits(observer_ != nullptr);
}

absl::StatusOr<std::vector<GenerationResult>> OfflineEngine::Generate(
    const std::vector<GenerationRequest>& requests, GenerationStats* stats) {
  if (broken_) return absl::FailedPreconditionError("an earlier step failed: the engine's state is lost");
  const int vocab = model_->config().vocab_size;
  std::vector<RequestSpec> specs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    for (int32_t t : r.prompt) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrFormat("request %d: prompt token %d outside the vocabulary [0, %d)", i, t, vocab));
      }
    }
    if (absl::Status s = ValidateSamplingParams(r.sampling); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("request %d: %s", i, s.message()));
    }
    RequestSpec& spec = specs[i];
    spec.prompt = r.prompt;
    spec.cache_namespace = r.cache_namespace;
    spec.sampling = r.sampling;
    // The scheduler expects as many entries as the sampler gives.
    spec.sampling.top_logprobs = std::min(spec.sampling.top_logprobs, vocab);
    spec.max_new_tokens = r.max_new_tokens;
    spec.stop_token_ids = r.stop_token_ids;
    spec.ignore_eos = r.ignore_eos;
    if (r.min_tokens < 0 || r.min_tokens > r.max_new_tokens) {
      return absl::InvalidArgumentError(absl::StrFormat("request %d: min_tokens must be in [0, max_new_tokens]", i));
    }
    spec.min_tokens = r.min_tokens;
  }
  // All or nothing: a request the scheduler refuses withdraws the others.
  const RequestId first = next_id_;
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::Status added = scheduler_->Add(next_id_, std::move(specs[i]));
    if (!added.ok()) {
      for (RequestId id = first; id < next_id_; ++id) scheduler_->Abort(id);
      return absl::Status(added.code(), absl::StrFormat("request %d: %s", i, added.message()));
    }
    ++next_id_;
  }

  std::vector<GenerationResult> results(requests.size());
  GenerationStats local;
  for (const GenerationRequest& r : requests) local.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  const int64_t preemptions_before = scheduler_->stats().preemptions_total;
  const KvTierStats tiers_before = scheduler_->tiers().stats();
  scheduler_->ResetPeaks();
  StepPlan plan;
  StepResult result;
  std::vector<SampleEvent> events;
  std::vector<int> row_requests;
  const absl::Time loop_start = absl::Now();
  while (scheduler_->HasWork()) {
    ASSIGN_OR_RETURN(const bool scheduled, scheduler_->Schedule(&plan));
    if (!scheduled) return absl::InternalError("requests wait but the scheduler planned no step");
    if (absl::Status s = executor_.Execute(plan, &result); !s.ok()) {
      broken_ = true;  // the model's pool may now be behind the scheduler's forest
      return s;
    }
    events.clear();
    RETURN_IF_ERROR(scheduler_->Complete(result, &events));
    ++local.steps;
    if (local.steps == 1) local.first_step_seconds = absl::ToDoubleSeconds(absl::Now() - loop_start);
    if (observer_ != nullptr && !plan.samples.empty()) {
      // Event k is plan.samples[k]: the row each request's logits are in.
      row_requests.assign(plan.logits_rows.size(), -1);
      for (size_t k = 0; k < events.size(); ++k) {
        row_requests[plan.samples[k].row] = static_cast<int>(events[k].request - first);
      }
      observer_(row_requests, executor_.logits());
    }
    for (const SampleEvent& e : events) {
      GenerationResult& out = results[e.request - first];
      out.tokens.push_back(e.token);
      out.logprobs.push_back(e.logprob);
      if (!e.top_token_ids.empty()) {
        out.top_token_ids.push_back(e.top_token_ids);
        out.top_logprobs.push_back(e.top_logprobs);
      }
      out.cached_prompt_tokens = e.cached_prompt_tokens;
      if (e.finish != FinishReason::kNone) out.finish_reason = e.finish == FinishReason::kLength ? "length" : "stop";
      ++local.generated_tokens;
    }
  }
  local.steps_seconds = absl::ToDoubleSeconds(absl::Now() - loop_start);
  for (const GenerationResult& r : results) local.cached_prompt_tokens += r.cached_prompt_tokens;
  const SchedulerStats s = scheduler_->stats();
  local.preemptions = s.preemptions_total - preemptions_before;
  local.peak_chunks = s.peak_used_chunks;
  local.peak_logical_chunks = s.peak_unshared_chunks;
  const KvTierStats& ts = scheduler_->tiers().stats();
  local.tier_writes = ts.host_written_total + ts.disk_written_total - tiers_before.host_written_total -
                      tiers_before.disk_written_total;
  local.tier_loads = ts.host_loads_total + ts.disk_loads_total - tiers_before.host_loads_total -
                     tiers_before.disk_loads_total;
  if (stats != nullptr) *stats = local;
  return results;
}

}  // namespace chunkattn
