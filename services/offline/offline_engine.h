// Runs a batch of generation requests to completion in one process: the
// coordinator's Scheduler plans every step and a worker's PlanExecutor runs
// it on a Model (CPU or GPU), with the tokens fed back as the coordinator
// does. So chunkattn-generate shares, copies on write, prefills in pieces,
// preempts and stops exactly as the served path: token-granular prefix
// matching, in-batch sharing, and the prefix cache kept across Generate()
// calls (LRU under pressure), and with KV tiers below the pool (issue 41:
// host memory, a disk file) what the pool evicts is loaded back instead of
// recomputed, as on a worker.
//
// Tensor parallelism: every rank runs the same Generate() on its own model
// shard. The plans are deterministic and the logits identical on every rank,
// so every rank samples the same tokens and the schedulers stay in step.
//
// Thread-compatible; drives the model from the calling thread.
#ifndef CHUNKATTN_SERVICES_OFFLINE_OFFLINE_ENGINE_H_
#define CHUNKATTN_SERVICES_OFFLINE_OFFLINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/plan/sampling_params.h"
#include "services/core/scheduler.h"
#include "base/host_memory.h"
#include "workers/model/model.h"
#include "workers/server/kv_tier_store.h"
#include "workers/server/plan_executor.h"

namespace chunkattn {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS
  bool ignore_eos = false;
  int min_tokens = 0;  // the first this many tokens are never EOS (unless ignore_eos) or a stop token
  std::string cache_namespace;  // requests share cache only within one
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  // Per token when sampling.top_logprobs > 0: the min(top_logprobs, vocab)
  // most likely tokens, most likely first, and their logprobs.
  std::vector<std::vector<int32_t>> top_token_ids;
  std::vector<std::vector<float>> top_logprobs;
  std::string finish_reason;     // "length" or "stop"
  int cached_prompt_tokens = 0;  // prompt tokens taken from the cache, not computed
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int steps = 0;
  int64_t preemptions = 0;
  int64_t peak_chunks = 0;          // physical chunks in use at the peak
  int64_t peak_logical_chunks = 0;  // chunks the same sequences need without sharing
  // Wall time of the first step (the prompts' prefill, or its first piece)
  // and of all steps: a batch's decode step is (steps_seconds -
  // first_step_seconds) / (steps - 1), timed in one run (bench/peer).
  double first_step_seconds = 0;
  double steps_seconds = 0;
  // KV tiers: blocks written into the host and disk tiers (stores and
  // demotions), and loaded back into the pool instead of recomputed.
  int64_t tier_writes = 0;
  int64_t tier_loads = 0;
};

struct OfflineEngineOptions {
  int32_t max_batch_size = 256;        // sequences with rows in one step
  int32_t max_tokens_per_step = 2048;  // input rows in one step
  bool prefix_sharing = true;          // false: every sequence computes its own chunks
  KvTierOptions tiers;                 // the KV tiers under the pool (none by default)
  bool tier_write_through = false;     // keep each block in the tiers once computed, not at eviction
  HostAllocator host_allocator = AllocateHostBytes;  // the host tier's memory (pinned on a GPU)
};

class OfflineEngine {
 public:
  // `model` is borrowed and must outlive the engine; its pool and chunk size
  // are the scheduler's. INVALID_ARGUMENT for bad options; the tiers'
  // errors (KvTierStore::Create).
  static absl::StatusOr<std::unique_ptr<OfflineEngine>> Create(Model* model, OfflineEngineOptions options = {});

  // Called after each step that sampled: the request index of each logits
  // row, and the (rows, vocab) fp32 logits. Setting one sends every step's
  // logits to the host (a GPU model otherwise samples on the device).
  using LogitsObserver = std::function<void(const std::vector<int>& requests, absl::Span<const float> logits)>;
  void set_logits_observer(LogitsObserver observer);

  // Results in request order. All or nothing: INVALID_ARGUMENT for a bad
  // request (empty prompt, token outside the vocabulary, prompt +
  // max_new_tokens past the context, bad sampling), RESOURCE_EXHAUSTED for
  // one that alone needs more chunks than the pool holds; nothing runs then.
  // A request that fits alone but not beside the others waits its turn.
  // INTERNAL / the model's error when a step fails (the engine is then unusable).
  absl::StatusOr<std::vector<GenerationResult>> Generate(const std::vector<GenerationRequest>& requests,
                                                         GenerationStats* stats = nullptr);

  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  OfflineEngine(Model* model, std::unique_ptr<Scheduler> scheduler, std::unique_ptr<KvTierStore> tiers);

  Model* model_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<KvTierStore> tiers_;  // before executor_, which borrows it
  PlanExecutor executor_;
  LogitsObserver observer_;
  RequestId next_id_ = 1;
  bool broken_ = false;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_OFFLINE_OFFLINE_ENGINE_H_
