// Runs a fixed batch of generation requests on one Model (CPU or GPU): the offline
// path behind chunkattn-generate and the multi-process tensor-parallel check.
// (The served path, with requests joining and leaving at every step, is the
// coordinator's.)
//
// Prefix sharing without configuration: prompts are sorted by their tokens,
// and a full prompt chunk equal to the previous prompt's chunk at the same
// depth (with everything before it shared too) is one physical chunk. Only
// the first sequence computes it; the others' prefill starts after it (the
// model appends every row's KV of a layer before any attention of that
// layer, so they can read it in the same step). Decode then runs over the
// (C, i, j) context with two-phase partition attention.
//
// Thread-compatible; drives the model from the calling thread. With tensor
// parallelism every rank runs the same Generate() on its own model shard and,
// since the logits are identical on every rank, samples the same tokens.
#ifndef CHUNKATTN_WORKERS_ENGINE_OFFLINE_ENGINE_H_
#define CHUNKATTN_WORKERS_ENGINE_OFFLINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/model/llama.h"
#include "workers/sampler/sampler.h"

namespace chunkattn {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS
  bool ignore_eos = false;
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string finish_reason;  // "length" or "stop"
  int cached_prompt_tokens = 0;  // prompt tokens whose KV another request computed
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int steps = 0;
  int64_t peak_chunks = 0;          // physical chunks in use at the peak
  int64_t peak_logical_chunks = 0;  // chunks the same sequences need without sharing
};

class OfflineEngine {
 public:
  // `share_prefixes` false gives every sequence its own chunks (the
  // baseline that sharing is measured against).
  explicit OfflineEngine(Model* model, bool share_prefixes = true)
      : model_(model), share_prefixes_(share_prefixes) {}

  // Called after each step with its logits: (rows, vocab), one row per
  // sequence still running, in request order.
  using LogitsObserver = std::function<void(int step, const std::vector<int>& requests,
                                            const std::vector<float>& logits)>;

  // INVALID_ARGUMENT for a bad request (empty prompt, token outside the
  // vocabulary, prompt + max_new_tokens past the context, bad sampling);
  // RESOURCE_EXHAUSTED when the batch needs more chunks than the pool holds.
  absl::StatusOr<std::vector<GenerationResult>> Generate(
      const std::vector<GenerationRequest>& requests, GenerationStats* stats = nullptr,
      const LogitsObserver& observer = nullptr);

 private:
  Model* model_;
  bool share_prefixes_;
  Sampler sampler_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_ENGINE_OFFLINE_ENGINE_H_
