// Runs the coordinator's per-iteration plans (proto/plan/step_plan.h) on one
// rank's model shard: decodes the plan into a ForwardBatch, keeps the decode
// context between versions (a plan carries the (C, i, j) context only when it
// changed, and the new lengths every step), and on rank 0 samples the rows
// the plan names, keeping each sample stream's token history for the
// repetition penalty. A model that samples on its device (GPU) sends back
// only the picks: the greedy ones from inside the step when every sample is
// greedy without a penalty, top_logprobs or token mask, else the full Sampler
// semantics after it. Other models' logits rows go through the CPU Sampler.
// Each sample's top_logprobs entries follow its token in the StepResult. A
// constrained sample's mask (SampleRow::allowed, structured outputs) goes to
// the sampler as SampleInput::allowed, on the device or the host alike (its
// logprobs are those of the masked row). A step with a sample still under its
// min_tokens takes the host path, where the suppressed tokens are set to
// -inf before the Sampler sees them.
//
// KV tiers (issue 41): a plan's moves run first, in order, before its copies
// and its forward pass: a store reads a pool chunk (Model::ReadChunk) into a
// slot of the KvTierStore, a load checks a slot and writes it into a pool
// chunk, a demote copies a host slot to a disk slot. Shared-tier moves go
// to the SharedKvStore (Redis) by key: a store is queued for its writer, a
// load is fetched and checked before the pool is touched. A move that fails (no
// tiers, a slot the tier lacks, a key or checksum that does not match, an
// I/O error) is listed in StepResult::failed_moves and the step goes on: a
// failed load leaves its chunk as it was, and the coordinator recomputes it.
// When the step's copies, prefill and decode context touch none of the
// moved pool chunks and the model allows it (Model::chunk_moves_beside_forward),
// the moves run on a thread of their own beside the forward pass instead,
// still in order; Execute joins it before it returns.
//
// Every plan comes from the network, so every field is checked before the
// model runs (INVALID_ARGUMENT): the model validates the batch, and this
// class the context, the lengths, the sampler keys and the moves' chunks.
//
// Thread-compatible: one thread (the worker's Execute stream) drives it. A
// step's mover thread touches only tiers_, shared_, move_buffer_ and the
// model's ReadChunk/WriteChunk, and ends inside that step's Execute.
#ifndef CHUNKATTN_WORKERS_SERVER_PLAN_EXECUTOR_H_
#define CHUNKATTN_WORKERS_SERVER_PLAN_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/api/chunk_context.h"
#include "proto/plan/step_plan.h"
#include "workers/model/model.h"
#include "workers/sampler/sampler.h"
#include "workers/server/kv_tier_store.h"
#include "workers/server/shared_kv_store.h"

namespace chunkattn {

class PlanExecutor {
 public:
  // `model`, `tiers` and `shared` are borrowed; `tiers` null: no host or
  // disk tier, `shared` null: no shared tier (their moves fail). Only the
  // rank that samples (rank 0) keeps sampler state and returns tokens.
  PlanExecutor(Model* model, bool samples, KvTierStore* tiers = nullptr, SharedKvStore* shared = nullptr)
      : model_(model), samples_(samples), tiers_(tiers), shared_(shared) {}

  // Reads the token masks of a plan whose masks follow it (one per sample of
  // the plan, in order; MasksFromProto), from the coordinator's stream.
  using AwaitMasks = std::function<absl::Status(std::vector<std::vector<uint32_t>>* masks)>;

  // Runs one step. On error the executor's state may be behind the
  // coordinator's: the session must be restarted. With plan.masks_follow
  // and `await_masks`, the sampling rank runs the forward pass first and
  // reads the masks only then (the coordinator computes them meanwhile; a
  // model sampling on its device has launched its layers: LateMasks);
  // otherwise the masks are the plan's own (SampleRow::allowed).
  absl::Status Execute(const StepPlan& plan, StepResult* result, const AwaitMasks& await_masks = nullptr);

  // With `keep`, every step takes the host-logits path (no sampling on the
  // device) and keeps its (logits_rows, vocab) fp32 logits in logits() until
  // the next Execute: for tools that record them.
  void set_keep_logits(bool keep) { keep_logits_ = keep; }
  const std::vector<float>& logits() const { return logits_; }
  // Steps so far whose moves ran beside their forward pass.
  int64_t moves_beside_forward() const { return moves_beside_forward_; }

 private:
  struct SamplerState {
    SamplingParams params;
    std::vector<int32_t> history;
    int32_t min_tokens = 0;
    std::vector<int32_t> suppress_ids;  // checked against the vocabulary
    // Whether the token of sample step `step` must not be a suppressed one.
    bool Suppressing(uint64_t step) const {
      return !suppress_ids.empty() && step < static_cast<uint64_t>(min_tokens);
    }
  };

  // INVALID_ARGUMENT for a move the plan cannot mean (an unknown kind or
  // tier, a negative slot, a store or load of a chunk outside the pool),
  // before any move runs.
  absl::Status CheckMoves(const StepPlan& plan) const;
  // A step's moves done: the indices of those that failed, and the seconds
  // spent loading from the shared tier.
  struct MoveOutcome {
    std::vector<int32_t> failed;
    double shared_load_seconds = 0;
  };
  // Runs the plan's moves in order.
  MoveOutcome ApplyMoves(const StepPlan& plan);
  absl::Status ApplyMove(const KvMove& move, double* shared_load_seconds);
  absl::Status ApplySharedMove(const KvMove& move, double* shared_load_seconds);
  // Whether the step's copies, prefill chunks and decode context leave out
  // every pool chunk its moves store or load.
  bool ForwardSkipsMovedChunks(const StepPlan& plan) const;
  absl::Status SetContext(const ChunkContext& context);
  absl::Status UpdateLengths(const StepPlan& plan);
  // The samplers and inputs of the plan's samples (borrowing its token
  // masks), checked; whether all can take ForwardGreedy. Sets masking_ when a
  // sample is under its min_tokens.
  absl::StatusOr<bool> LookupSamplers(const StepPlan& plan);
  // The masks that follow the plan, checked, as the samples' inputs.
  absl::Status TakeMasks(const AwaitMasks& await_masks);
  // picks_ from the host logits_ through the CPU Sampler.
  absl::Status SampleOnHost();
  // picks_ into the result, and each penalized stream's history.
  absl::Status Report(StepResult* result);

  Model* model_;
  bool samples_;
  KvTierStore* tiers_;              // null: no tiers
  SharedKvStore* shared_;           // null: no shared tier
  std::vector<uint8_t> move_buffer_;  // one chunk's KV, on its way between the pool and the shared tier
  int64_t moves_beside_forward_ = 0;  // steps whose moves ran beside their forward pass
  bool keep_logits_ = false;
  bool have_context_ = false;
  ChunkContext ctx_;
  bool seen_version_ = false;  // the newest context version offered, accepted or not
  uint64_t last_version_ = 0;
  // Per context sequence: chunks on its path, and the table entry of its
  // last chunk (private index, or -1 - shared index).
  std::vector<int32_t> path_chunks_;
  std::vector<int32_t> tail_entry_;
  absl::flat_hash_map<int64_t, SamplerState> samplers_;
  Sampler sampler_;
  bool masking_ = false;  // this step: some sample has tokens to suppress (min_tokens)
  // Per plan sample: its stream, logits row, Sampler input and pick.
  std::vector<SamplerState*> sample_states_;
  std::vector<int32_t> sample_rows_;
  std::vector<SampleInput> sample_inputs_;
  std::vector<std::vector<uint32_t>> awaited_masks_;  // the step's masks that followed its plan
  std::vector<SampleResult> picks_;
  std::vector<float> logits_;
  std::vector<int32_t> greedy_tokens_;
  std::vector<float> greedy_logprobs_;
  std::vector<float> sample_logits_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SERVER_PLAN_EXECUTOR_H_
