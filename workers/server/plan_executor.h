// Runs the coordinator's per-iteration plans (worker.proto StepPlan) on one
// rank's model shard: decodes the plan into a ForwardBatch, keeps the decode
// context between versions (a plan carries the (C, i, j) context only when it
// changed, and the new lengths every step), and on rank 0 samples the rows
// the plan names, keeping each sample stream's token history for the
// repetition penalty. When every sample of a step is greedy without a
// penalty and the model can pick on its device (GPU), only the picks come
// back to the host; otherwise the logits rows go through the CPU Sampler.
//
// Every plan comes from the network, so every field is checked before the
// model runs (INVALID_ARGUMENT): the model validates the batch, and this
// class the context, the lengths and the sampler keys.
//
// Thread-compatible: one thread (the worker's Execute stream) drives it.
#ifndef CHUNKATTN_WORKERS_SERVER_PLAN_EXECUTOR_H_
#define CHUNKATTN_WORKERS_SERVER_PLAN_EXECUTOR_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chunkattn/internal/v1/worker.pb.h"
#include "kernels/api/chunk_context.h"
#include "workers/model/model.h"
#include "workers/sampler/sampler.h"

namespace chunkattn {

class PlanExecutor {
 public:
  // `model` is borrowed. Only the rank that samples (rank 0) keeps sampler
  // state and returns tokens.
  PlanExecutor(Model* model, bool samples) : model_(model), samples_(samples) {}

  // Runs one step. On error the executor's state may be behind the
  // coordinator's: the session must be restarted.
  absl::Status Execute(const internal::v1::StepPlan& plan, internal::v1::StepResult* result);

 private:
  struct SamplerState {
    SamplingParams params;
    std::vector<int32_t> history;
  };

  absl::Status SetContext(const internal::v1::DecodeContext& dc);
  absl::Status UpdateLengths(const internal::v1::StepPlan& plan);
  // The samplers of the plan's samples, checked; whether all are greedy.
  absl::StatusOr<bool> LookupSamplers(const internal::v1::StepPlan& plan);
  absl::Status Sample(const internal::v1::StepPlan& plan, internal::v1::StepResult* result);
  absl::Status TakeGreedy(const internal::v1::StepPlan& plan, internal::v1::StepResult* result);

  Model* model_;
  bool samples_;
  bool have_context_ = false;
  ChunkContext ctx_;
  // Per context sequence: chunks on its path, and the table entry of its
  // last chunk (private index, or -1 - shared index).
  std::vector<int32_t> path_chunks_;
  std::vector<int32_t> tail_entry_;
  absl::flat_hash_map<int64_t, SamplerState> samplers_;
  Sampler sampler_;
  std::vector<SamplerState*> sample_states_;  // per plan sample
  std::vector<float> logits_;
  std::vector<int32_t> greedy_tokens_;
  std::vector<float> greedy_logprobs_;
  std::vector<float> sample_logits_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SERVER_PLAN_EXECUTOR_H_
