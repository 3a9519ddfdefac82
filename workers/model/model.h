// The interface a worker drives a model shard through, whatever it runs on:
// LlamaModel (CPU, fp32, the oracle) and CudaLlamaModel (GPU, fp16/bf16).
// Also the types of one iteration's work, and StepRows: the validation and
// the per-row positions and KV slots of a step, shared by every
// implementation so a malformed batch is refused the same way everywhere.
//
// Thread-compatible: one thread (the worker's) drives a model.
#ifndef CHUNKATTN_WORKERS_MODEL_MODEL_H_
#define CHUNKATTN_WORKERS_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/model/model_config.h"
#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"
#include "kernels/cpu/attention.h"
#include "workers/model/kv_pool.h"
#include "workers/model/weights.h"
#include "workers/sampler/sampler.h"

namespace chunkattn {

struct ModelOptions {
  int chunk_size = 64;             // tokens per KV chunk
  int64_t num_kv_chunks = 0;       // KV pool capacity, chunks
  DType kv_dtype = DType::kFloat32;
  DecodeImpl decode_impl = DecodeImpl::kTpp;
  cpu::Isa cpu_isa = cpu::BestIsa();  // the CPU model's kernels (an ISA this CPU runs)
};

// One iteration's work. Rows of the step, in order: the prefill tokens,
// sequence by sequence as in `prefill`, then one decode token per sequence of
// `decode` in context order.
struct ForwardBatch {
  std::vector<int32_t> tokens;  // (num_rows) input token ids
  // Prefill pieces: sequence s feeds tokens at positions prefix_len[s] ...;
  // its chunk list must hold room for them. May be empty.
  PrefillBatch prefill;
  // Decode: sequence s feeds one token at position seq_len[s] - 1 (seq_len
  // counts it). Null when the step has no decode tokens.
  const ChunkContext* decode = nullptr;
  std::vector<KvCopy> copies;        // applied before any KV write
  std::vector<int32_t> logits_rows;  // rows whose next-token logits are wanted
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ModelOptions& options() const = 0;
  // "cpu" or "cuda:N".
  virtual std::string device() const = 0;

  // Runs one step and writes (batch.logits_rows.size(), vocab) fp32 logits
  // to host memory. INVALID_ARGUMENT for a malformed batch, checked before
  // anything is written (StepRows); the KV of the step's tokens is in the
  // pool afterwards.
  virtual absl::Status Forward(const ForwardBatch& batch, std::vector<float>& logits) = 0;

  // Whether ForwardGreedy picks tokens where the logits are (a GPU model
  // then copies back two numbers per row instead of a vocabulary of logits).
  virtual bool has_device_greedy() const { return false; }
  // Forward, then per logits row the greedy token (argmax, ties to the lowest
  // id, NaN as -inf) and its log-softmax: what Sampler gives at temperature 0
  // without repetition penalty or token mask, and no top_logprobs (callers
  // send samples that ask for them, or are constrained, through
  // ForwardSample). UNIMPLEMENTED unless has_device_greedy().
  virtual absl::Status ForwardGreedy(const ForwardBatch& batch, std::vector<int32_t>& tokens,
                                     std::vector<float>& logprobs);

  // Whether ForwardSample samples where the logits are, with the Sampler's
  // full semantics (a GPU model copies back two numbers per sample).
  virtual bool has_device_sampling() const { return false; }
  // Forward, then sample s from logits row rows[s] (an index into
  // batch.logits_rows; samples may share a row) with inputs[s]: Sampler's
  // semantics (token masks included), the same token up to the rounding
  // kernels/cuda/sample_row.h bounds, and out[s].top where inputs[s] asks
  // top_logprobs (the Sampler's own TopLogprobsOfRow on the host:
  // AddTopLogprobs). out[s].token is -1 for a row the Sampler refuses for its
  // logits.
  // INVALID_ARGUMENT for inputs the Sampler refuses, before the step runs.
  // UNIMPLEMENTED unless has_device_sampling().
  //
  // With `late_masks` (not null), the token masks are not in `inputs`: the
  // model launches the forward pass first, then calls it for one mask per
  // sample (empty: none; checked as inputs' are) and samples under those.
  // The host waits for the masks (the coordinator computes them during the
  // step) while the device runs the layers. An error from it is returned
  // once the launched work has finished.
  using LateMasks = std::function<absl::StatusOr<absl::Span<const std::vector<uint32_t>>>()>;
  virtual absl::Status ForwardSample(const ForwardBatch& batch, absl::Span<const int32_t> rows,
                                     absl::Span<const SampleInput> inputs, std::vector<SampleResult>& out,
                                     const LateMasks* late_masks = nullptr);

  // Copy-on-write KV copies without a forward pass (a step with no rows).
  virtual absl::Status CopyKv(absl::Span<const KvCopy> copies) = 0;

  // One pool chunk's KV as bytes, for the KV tiers below the pool (issue 41):
  // this rank's shard of every layer, K and V, in KvPool::ReadChunk's order
  // and the pool's dtype; KvShapeOf(...).BytesPerChunk() bytes (what Join
  // reports as kv_chunk_bytes). Synchronous: on a GPU the copy is done on
  // return. INVALID_ARGUMENT for a chunk outside the pool or a buffer of
  // another size, before anything is copied.
  virtual absl::Status ReadChunk(int32_t chunk, absl::Span<uint8_t> out) = 0;
  // Bytes of one chunk in ReadChunk's form.
  virtual int64_t kv_chunk_bytes() const = 0;
  virtual absl::Status WriteChunk(int32_t chunk, absl::Span<const uint8_t> in) = 0;
  // Whether ReadChunk and WriteChunk may run on another thread while a
  // Forward*, or CopyKv, runs on chunks that pass does not touch (the worker
  // then overlaps a step's KV tier moves with its forward pass).
  virtual bool chunk_moves_beside_forward() const { return false; }
};

// What a GPU runs `config` in when no dtype is asked for: the checkpoint's
// bfloat16, else float16 (the GPU kernels take no float32).
DType DefaultGpuDType(const ModelConfig& config);

// The KV pool of one rank of `config` sharded as `layout`, with the chunk size
// and dtype of `options`.
KvGeometry KvShapeOf(const ModelConfig& config, const ShardLayout& layout, const ModelOptions& options);

// INVALID_ARGUMENT unless weights sharded for `layout` belong to rank `rank`
// of a group of `world_size` (a model without a communicator is rank 0 of 1).
absl::Status CheckShardMatchesGroup(const ShardLayout& layout, int rank, int world_size);

// Positions and KV slots of every row of a step, after validating the batch
// (token ids, logits rows, prefill pieces, the decode context and lengths,
// positions against the model's context). Keeps the decode plan of the last
// context version, which CPU attention also runs on.
class StepRows {
 public:
  absl::Status Plan(const ForwardBatch& batch, const ModelConfig& config, int chunk_size,
                    int64_t num_chunks);

  int64_t num_rows() const { return static_cast<int64_t>(positions_.size()); }
  int64_t prefill_rows() const { return prefill_rows_; }
  const std::vector<int32_t>& positions() const { return positions_; }
  const std::vector<int64_t>& slots() const { return slots_; }
  // The plan of the context of the last batch with decode rows.
  const DecodePlan& decode_plan() const { return plan_; }

 private:
  bool have_plan_ = false;
  DecodePlan plan_;
  int64_t prefill_rows_ = 0;
  std::vector<int32_t> positions_;
  std::vector<int64_t> slots_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_MODEL_H_
