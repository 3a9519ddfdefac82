#include "workers/server/plan_executor.h"

#include <algorithm>
#include <future>
#include <limits>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace chunkattn {

absl::Status PlanExecutor::SetContext(const ChunkContext& from) {
  // The models keep plans per version, so a version must never name two
  // contexts: each new one is newer than any seen (the scheduler counts up).
  // Checked against every version offered, not only the one in force: a
  // context refused after this point must not let an older version back in
  // over a model plan made for it.
  if (seen_version_ && from.version <= last_version_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "context version %d is not newer than %d: a new context needs a new version", from.version,
        last_version_));
  }
  have_context_ = false;  // until the new one is in place
  seen_version_ = true;
  last_version_ = from.version;
  ChunkContext ctx = from;
  ctx.chunk_size = model_->options().chunk_size;
  const int n = ctx.num_seqs();
  if (static_cast<int>(ctx.private_begin.size()) != n || static_cast<int>(ctx.private_end.size()) != n) {
    return absl::InvalidArgumentError("context: private_begin/private_end must have one entry per sequence");
  }
  const int ns = ctx.num_shared();
  if (static_cast<int>(ctx.shared_begin.size()) != ns || static_cast<int>(ctx.shared_end.size()) != ns ||
      static_cast<int>(ctx.shared_tokens.size()) != ns) {
    return absl::InvalidArgumentError("context: shared arrays differ in length");
  }
  // Every index below is used before the model's full check
  // (ValidateChunkContext, once seq_len is in): bound them all here.
  const int64_t table = static_cast<int64_t>(ctx.private_chunk.size());
  if (static_cast<int64_t>(ctx.private_tokens.size()) != table) {
    return absl::InvalidArgumentError("context: private_chunk and private_tokens differ in length");
  }
  path_chunks_.assign(n, 0);
  tail_entry_.assign(n, 0);
  for (int k = 0; k < ns; ++k) {
    const int i = ctx.shared_begin[k], j = ctx.shared_end[k];
    if (i < 0 || j > n || i >= j) {
      return absl::InvalidArgumentError(absl::StrFormat("context: shared entry %d has range [%d, %d)", k, i, j));
    }
    for (int s = i; s < j; ++s) {
      ++path_chunks_[s];
      tail_entry_[s] = -1 - k;
    }
  }
  for (int s = 0; s < n; ++s) {
    const int32_t begin = ctx.private_begin[s], end = ctx.private_end[s];
    if (begin < 0 || end < begin || end > table) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "context: sequence %d has private range [%d, %d) of a table of %d entries", s, begin, end, table));
    }
    const int count = end - begin;
    path_chunks_[s] += count;
    if (count > 0) tail_entry_[s] = ctx.private_end[s] - 1;
    if (path_chunks_[s] == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("context: sequence %d has no chunks", s));
    }
  }
  // seq_len arrives with the step; ValidateChunkContext runs in the model
  // once the lengths are in.
  ctx.seq_len.assign(n, 0);
  ctx_ = std::move(ctx);
  have_context_ = true;
  return absl::OkStatus();
}

absl::Status PlanExecutor::UpdateLengths(const StepPlan& plan) {
  if (!have_context_) return absl::InvalidArgumentError("a decode step before any context");
  const int n = ctx_.num_seqs();
  if (static_cast<int64_t>(plan.seq_len.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("seq_len has %d entries for a context of %d sequences", plan.seq_len.size(), n));
  }
  const int c = ctx_.chunk_size;
  for (int s = 0; s < n; ++s) {
    const int32_t len = plan.seq_len[s];
    const int64_t in_tail = int64_t{len} - int64_t{path_chunks_[s] - 1} * c;
    if (in_tail < 1 || in_tail > c) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "seq_len[%d] = %d does not fit its %d chunks: the context is stale", s, len, path_chunks_[s]));
    }
    const int e = tail_entry_[s];
    if (e >= 0) {
      ctx_.private_tokens[e] = static_cast<int32_t>(in_tail);
    } else if (ctx_.shared_tokens[-1 - e] != in_tail) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "seq_len[%d] = %d grows a shared chunk without a new context", s, len));
    }
    ctx_.seq_len[s] = len;
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::CheckMoves(const StepPlan& plan) const {
  const int64_t chunks = model_->options().num_kv_chunks;
  for (size_t k = 0; k < plan.moves.size(); ++k) {
    const KvMove& m = plan.moves[k];
    if (m.kind != KvMove::Kind::kStore && m.kind != KvMove::Kind::kLoad && m.kind != KvMove::Kind::kDemote) {
      return absl::InvalidArgumentError(absl::StrFormat("KV move %d: unknown kind %d", k, static_cast<int>(m.kind)));
    }
    if (m.tier != KvTier::kHost && m.tier != KvTier::kDisk && m.tier != KvTier::kShared) {
      return absl::InvalidArgumentError(absl::StrFormat("KV move %d: unknown tier %d", k, static_cast<int>(m.tier)));
    }
    if (m.tier == KvTier::kShared && m.kind == KvMove::Kind::kDemote) {
      return absl::InvalidArgumentError(absl::StrFormat("KV move %d: a demote from the shared tier", k));
    }
    if (m.slot < 0 || m.to_slot < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("KV move %d: negative slot", k));
    }
    if (m.kind != KvMove::Kind::kDemote && (m.chunk < 0 || m.chunk >= chunks)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("KV move %d: chunk %d is outside the pool's [0, %d)", k, m.chunk, chunks));
    }
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::ApplyMove(const KvMove& m, double* shared_load_seconds) {
  if (m.tier == KvTier::kShared) return ApplySharedMove(m, shared_load_seconds);
  if (tiers_ == nullptr) return absl::FailedPreconditionError("this worker has no KV tiers");
  // The model copies straight into and out of the tier's memory (pinned
  // on a GPU worker).
  switch (m.kind) {
    case KvMove::Kind::kStore:
      return tiers_->StoreFrom(m.tier, m.slot, m.key,
                               [&](absl::Span<uint8_t> chunk) { return model_->ReadChunk(m.chunk, chunk); });
    case KvMove::Kind::kLoad:
      // Checked whole before the pool is touched: a failed load leaves the
      // chunk as it was.
      return tiers_->LoadTo(m.tier, m.slot, m.key,
                            [&](absl::Span<const uint8_t> chunk) { return model_->WriteChunk(m.chunk, chunk); });
    case KvMove::Kind::kDemote:
      return tiers_->Demote(m.slot, m.to_slot);  // always host -> disk: `tier` is not read
  }
  return absl::InvalidArgumentError("unknown KV move");
}

absl::Status PlanExecutor::ApplySharedMove(const KvMove& m, double* shared_load_seconds) {
  if (shared_ == nullptr) return absl::FailedPreconditionError("this worker has no shared KV tier");
  move_buffer_.resize(static_cast<size_t>(shared_->chunk_bytes()));
  const absl::Span<uint8_t> bytes = absl::MakeSpan(move_buffer_);
  if (m.kind == KvMove::Kind::kStore) {
    RETURN_IF_ERROR(model_->ReadChunk(m.chunk, bytes));
    return shared_->Store(m.key, bytes);
  }
  // A load, checked whole before the pool is touched (CheckMoves refused a
  // demote).
  const absl::Time start = absl::Now();
  absl::Status loaded = shared_->Load(m.key, bytes);
  *shared_load_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  RETURN_IF_ERROR(loaded);
  return model_->WriteChunk(m.chunk, bytes);
}

PlanExecutor::MoveOutcome PlanExecutor::ApplyMoves(const StepPlan& plan) {
  MoveOutcome out;
  for (size_t k = 0; k < plan.moves.size(); ++k) {
    // Not the step's error: a tier that is full, corrupt or gone costs the
    // coordinator a recompute of the chunk, never the request.
    if (!ApplyMove(plan.moves[k], &out.shared_load_seconds).ok()) out.failed.push_back(static_cast<int32_t>(k));
  }
  return out;
}

bool PlanExecutor::ForwardSkipsMovedChunks(const StepPlan& plan) const {
  std::vector<int32_t> moved;
  for (const KvMove& m : plan.moves) {
    if (m.kind != KvMove::Kind::kDemote) moved.push_back(m.chunk);
  }
  if (moved.empty()) return true;
  std::sort(moved.begin(), moved.end());
  const auto touches = [&](absl::Span<const int32_t> chunks) {
    for (int32_t c : chunks) {
      if (std::binary_search(moved.begin(), moved.end(), c)) return true;
    }
    return false;
  };
  for (const KvCopy& c : plan.copies) {
    if (touches({c.src_chunk, c.dst_chunk})) return false;
  }
  if (touches(plan.prefill.chunk_ids)) return false;
  if (plan.has_decode) {
    // The context this step decodes with: the plan's new one, else the kept
    // one (SetContext checks either before the pass).
    const ChunkContext* ctx = plan.has_context ? &plan.context : have_context_ ? &ctx_ : nullptr;
    if (ctx != nullptr && (touches(ctx->shared_chunk) || touches(ctx->private_chunk))) return false;
  }
  return true;
}

absl::Status PlanExecutor::Execute(const StepPlan& plan, StepResult* result, const AwaitMasks& await_masks) {
  const absl::Time start = absl::Now();
  result->step = plan.step;
  result->tokens.clear();
  result->logprobs.clear();
  result->top_token_ids.clear();
  result->top_logprobs.clear();
  result->compute_seconds = 0;
  result->failed_moves.clear();
  result->shared_load_seconds = 0;
  RETURN_IF_ERROR(CheckMoves(plan));
  if (samples_) {
    for (const SamplerStart& s : plan.sampler_starts) {
      SamplerState state;
      state.params = s.params;
      state.params.return_logprobs = false;
      RETURN_IF_ERROR(ValidateSamplingParams(state.params));
      state.history = s.history;
      const int vocab = model_->config().vocab_size;
      if (s.min_tokens < 0) return absl::InvalidArgumentError("a sampler's min_tokens is negative");
      for (int32_t id : s.suppress_ids) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrFormat("suppressed token %d is outside [0, %d)", id, vocab));
        }
      }
      state.min_tokens = s.min_tokens;
      state.suppress_ids = s.suppress_ids;
      samplers_[s.key] = std::move(state);
    }
  }

  // Before the copies and any KV write of the step (step_plan.h), or on a
  // thread of their own beside them when the step touches none of the moved
  // chunks: a load read from disk or Redis then costs the running batch no
  // time of its own. The future joins the thread on every way out of here.
  std::future<MoveOutcome> beside;
  MoveOutcome moved;
  if (!plan.moves.empty() && model_->chunk_moves_beside_forward() && ForwardSkipsMovedChunks(plan)) {
    beside = std::async(std::launch::async, [this, &plan] { return ApplyMoves(plan); });
    ++moves_beside_forward_;
  } else {
    moved = ApplyMoves(plan);
  }

  // The model reads its batch as a ForwardBatch; the copy of the row arrays
  // is small next to the step.
  ForwardBatch batch;
  batch.tokens = plan.tokens;
  batch.prefill = plan.prefill;
  batch.copies = plan.copies;
  batch.logits_rows = plan.logits_rows;
  if (plan.has_context) RETURN_IF_ERROR(SetContext(plan.context));
  if (plan.has_decode) {
    RETURN_IF_ERROR(UpdateLengths(plan));
    batch.decode = &ctx_;
  }
  if (batch.tokens.empty()) {
    if (!batch.logits_rows.empty() || !plan.samples.empty()) {
      return absl::InvalidArgumentError("a plan without rows asks for logits");
    }
    RETURN_IF_ERROR(model_->CopyKv(batch.copies));
  } else {
    // Ranks that do not sample take the cheap path: no logits to the host.
    // A bad sample is reported after the forward pass, so rank 0 still joins
    // the step's collectives and its peers do not wait out the timeout.
    absl::StatusOr<bool> samplers = samples_ ? LookupSamplers(plan) : absl::StatusOr<bool>(true);
    const bool awaiting = samples_ && plan.masks_follow && await_masks != nullptr;
    const bool greedy = samplers.ok() && *samplers;
    if (!samplers.ok()) {
      RETURN_IF_ERROR(model_->Forward(batch, logits_));
      return samplers.status();
    }
    if (!keep_logits_ && !masking_ && greedy && model_->has_device_greedy()) {
      RETURN_IF_ERROR(model_->ForwardGreedy(batch, greedy_tokens_, greedy_logprobs_));
      if (samples_) {
        picks_.resize(sample_rows_.size());
        for (size_t k = 0; k < sample_rows_.size(); ++k) {
          picks_[k] = {greedy_tokens_[sample_rows_[k]], greedy_logprobs_[sample_rows_[k]], {}};
        }
      }
    } else if (!keep_logits_ && !masking_ && samples_ && model_->has_device_sampling()) {
      // The device model samples in the same call: it asks for the masks
      // once the forward pass is launched.
      const Model::LateMasks late = [&]() -> absl::StatusOr<absl::Span<const std::vector<uint32_t>>> {
        RETURN_IF_ERROR(TakeMasks(await_masks));
        return absl::MakeConstSpan(awaited_masks_);
      };
      RETURN_IF_ERROR(model_->ForwardSample(batch, sample_rows_, sample_inputs_, picks_, awaiting ? &late : nullptr));
    } else {
      RETURN_IF_ERROR(model_->Forward(batch, logits_));
      if (awaiting) RETURN_IF_ERROR(TakeMasks(await_masks));  // computed while this forward pass ran
      if (samples_) RETURN_IF_ERROR(SampleOnHost());
    }
    if (samples_) RETURN_IF_ERROR(Report(result));
  }
  if (beside.valid()) moved = beside.get();
  result->failed_moves = std::move(moved.failed);
  result->shared_load_seconds = moved.shared_load_seconds;
  for (int64_t key : plan.sampler_ends) samplers_.erase(key);
  result->compute_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

namespace {

// INVALID_ARGUMENT unless a constrained sample's mask fits the vocabulary
// and allows at least one of its tokens: the Sampler would refuse such a row
// after the step (no finite logit); the plan is refused before it runs.
absl::Status CheckAllowedTokens(absl::Span<const uint32_t> allowed, int vocab, int sample) {
  if (absl::Status status = ValidateAllowedTokens(allowed, vocab); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("sample %d: %s", sample, status.message()));
  }
  if (!AllowsSomeToken(allowed, vocab)) {
    return absl::InvalidArgumentError(absl::StrFormat("sample %d: its token mask allows no token", sample));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> PlanExecutor::LookupSamplers(const StepPlan& plan) {
  const int rows = static_cast<int>(plan.logits_rows.size());
  const int n = static_cast<int>(plan.samples.size());
  sample_states_.resize(n);
  sample_rows_.resize(n);
  sample_inputs_.resize(n);
  bool greedy = true;
  masking_ = false;
  for (int k = 0; k < n; ++k) {
    const SampleRow& row = plan.samples[k];
    if (row.row < 0 || row.row >= rows) {
      return absl::InvalidArgumentError(absl::StrFormat("sample %d names logits row %d of %d", k, row.row, rows));
    }
    auto it = samplers_.find(row.key);
    if (it == samplers_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat("sample %d: unknown sampler key %d", k, row.key));
    }
    SamplerState& state = it->second;
    const SamplingParams& p = state.params;
    // ForwardGreedy returns only the picks and applies no token mask:
    // top_logprobs and constrained samples take the sampling path, whose
    // models return them (a GPU model by its host fallback) and mask.
    greedy &= (p.temperature == 0 || p.top_k == 1) && p.repetition_penalty == 1.0f && p.top_logprobs == 0 &&
              row.allowed.empty() && !plan.masks_follow;
    sample_states_[k] = &state;
    sample_rows_[k] = row.row;
    sample_inputs_[k].params = &state.params;
    sample_inputs_[k].history = state.history;
    sample_inputs_[k].step = row.step;
    // Borrowed from the plan, which outlives the step's sampling.
    sample_inputs_[k].allowed = row.allowed;
    masking_ |= state.Suppressing(row.step);
    RETURN_IF_ERROR(CheckAllowedTokens(row.allowed, model_->config().vocab_size, k));
  }
  return greedy;
}

absl::Status PlanExecutor::TakeMasks(const AwaitMasks& await_masks) {
  RETURN_IF_ERROR(await_masks(&awaited_masks_));
  if (awaited_masks_.size() != sample_inputs_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("%d token masks for %d samples", awaited_masks_.size(),
                                                      sample_inputs_.size()));
  }
  for (size_t k = 0; k < awaited_masks_.size(); ++k) {
    RETURN_IF_ERROR(CheckAllowedTokens(awaited_masks_[k], model_->config().vocab_size, static_cast<int>(k)));
    sample_inputs_[k].allowed = awaited_masks_[k];
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::SampleOnHost() {
  const int vocab = model_->config().vocab_size;
  const int n = static_cast<int>(sample_rows_.size());
  picks_.resize(n);
  if (n == 0) return absl::OkStatus();
  sample_logits_.resize(static_cast<size_t>(n) * vocab);
  for (int k = 0; k < n; ++k) {
    float* row = sample_logits_.data() + static_cast<ptrdiff_t>(k) * vocab;
    std::copy_n(logits_.begin() + static_cast<ptrdiff_t>(sample_rows_[k]) * vocab, vocab, row);
    const SamplerState& state = *sample_states_[k];
    if (state.Suppressing(sample_inputs_[k].step)) {
      for (int32_t id : state.suppress_ids) row[id] = -std::numeric_limits<float>::infinity();
    }
  }
  return sampler_.Sample(sample_logits_, vocab, sample_inputs_, absl::MakeSpan(picks_));
}

absl::Status PlanExecutor::Report(StepResult* result) {
  for (size_t k = 0; k < picks_.size(); ++k) {
    if (picks_[k].token < 0) {
      // What the Sampler says of the same row on the host.
      return absl::InvalidArgumentError(absl::StrFormat(
          "logits row %d has a +inf logit or no finite logit", sample_rows_[k]));
    }
    // The coordinator splits the top entries by each sample's top_logprobs.
    const TopTokens& top = picks_[k].top;
    const int want = std::min(sample_states_[k]->params.top_logprobs, model_->config().vocab_size);
    if (top.size != want) {
      return absl::InternalError(absl::StrFormat("sample %d has %d top logprobs, want %d", k, top.size, want));
    }
    result->tokens.push_back(picks_[k].token);
    result->logprobs.push_back(picks_[k].logprob);
    result->top_token_ids.insert(result->top_token_ids.end(), top.ids.begin(), top.ids.begin() + top.size);
    result->top_logprobs.insert(result->top_logprobs.end(), top.logprobs.begin(), top.logprobs.begin() + top.size);
    if (sample_states_[k]->params.repetition_penalty != 1.0f) {
      sample_states_[k]->history.push_back(picks_[k].token);
    }
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
