// The Llama-family decoder on one GPU (built when CUDA is): the same model and
// step semantics as LlamaModel, which is its oracle, in fp16 or bf16.
//
// Per layer: fused residual-add + RMSNorm (fp32 residual stream), cuBLAS
// GEMMs (16-bit inputs, fp32 accumulate; the q/k/v and row-parallel outputs
// in fp32), Qwen3's per-head q/k RMSNorm (in place on the fp32 q/k/v, bias
// first), fused bias + rotary embedding + KV append into the chunked pool,
// chunked prefill and two-phase partition decode attention (kernels/cuda),
// SwiGLU, and with tensor parallelism an NCCL all-reduce (fp32) after o_proj
// and after down_proj. Sampling runs on the GPU: the greedy pick and its
// logprob inside the step, or the full Sampler semantics (LaunchSample, token
// masks included) after it; only the tokens and logprobs come back, and for
// samples that ask top_logprobs their logits rows, ranked on the host (a
// fallback: rare).
//
// Decode-only steps run as one CUDA graph per batch-size bucket (1, 2, 4, 8,
// 16, then multiples of 16): the rows past the batch are padding whose KV is
// never written, and the graph reads everything that changes between steps
// (tokens, positions, slots, the attention plan) from device buffers, so a
// step only uploads those and replays. The (C, i, j) plan is re-uploaded
// only when the context version changes. A bucket's first step runs eagerly
// (lazy NCCL and cuBLAS setup stays out of the capture); its second is
// captured.
//
// Memory: the weights, a workspace for `max_rows` rows and the attention
// plan buffers for every decode step of up to min(max_rows, max_batch)
// sequences of up to max_context tokens (CudaAttention::ReserveDecode, so no
// step reallocates a buffer a graph reads) are allocated at Create; the KV
// pool by AllocateKvPool (the worker sizes it from what is free then,
// KvCapacity).
//
// Thread-compatible: one thread drives it; the device is set on each call.
#ifndef CHUNKATTN_WORKERS_MODEL_CUDA_LLAMA_H_
#define CHUNKATTN_WORKERS_MODEL_CUDA_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/model/gpu_model.h"
#include "workers/model/model.h"
#include "workers/model/weights.h"
#include "workers/sampler/row_sampling.h"

namespace chunkattn {

class NcclCommunicator;

// Its options are the factory's (gpu_model.h).
using CudaModelOptions = GpuModelOptions;

// The graph bucket of a decode batch of `n` rows: the smallest of 1, 2, 4, 8,
// 16, 32, 48, ... that holds it (0 for n < 1).
int GraphBucket(int n);

// The number of KV chunks of `chunk_bytes` that fit when the process may use
// `fraction` of `total_bytes` in all and `free_bytes` are free now (weights and
// workspace already allocated): free - (1 - fraction) * total, in chunks,
// less `reserve_bytes` for allocations still to come. 0 when nothing fits.
int64_t KvChunksForMemory(int64_t free_bytes, int64_t total_bytes, double fraction,
                          int64_t reserve_bytes, int64_t chunk_bytes);

class CudaLlamaModel final : public GpuModel {
 public:
  // `weights` are converted to options.kv_dtype (fp16 or bf16: the one dtype
  // of weights, activations and KV on the GPU) and uploaded; their host copy
  // is released as it goes. `comm` (null for one rank) is borrowed. The KV
  // pool is allocated here when options.num_kv_chunks > 0.
  static absl::StatusOr<std::unique_ptr<CudaLlamaModel>> Create(const ModelConfig& config,
                                                                ModelWeights weights,
                                                                const ModelOptions& options,
                                                                const CudaModelOptions& cuda,
                                                                NcclCommunicator* comm);
  ~CudaLlamaModel() override;

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  std::string device() const override;
  const ShardLayout& layout() const { return layout_; }

  absl::StatusOr<int64_t> KvCapacity(double gpu_memory_fraction) const override;
  absl::Status AllocateKvPool(int64_t num_chunks) override;

  absl::Status Forward(const ForwardBatch& batch, std::vector<float>& logits) override;
  bool has_device_greedy() const override { return true; }
  absl::Status ForwardGreedy(const ForwardBatch& batch, std::vector<int32_t>& tokens,
                             std::vector<float>& logprobs) override;
  // The history bitmap of a penalized sample lives in shared memory: larger
  // vocabularies sample on the host.
  bool has_device_sampling() const override;
  absl::Status ForwardSample(const ForwardBatch& batch, absl::Span<const int32_t> rows,
                             absl::Span<const SampleInput> inputs, std::vector<SampleResult>& out,
                             const LateMasks* late_masks = nullptr) override;
  absl::Status CopyKv(absl::Span<const KvCopy> copies) override;
  // cudaMemcpyAsync on the model's stream, one per layer and K/V, then a
  // synchronize: the bytes are in place on return (pageable host memory).
  absl::Status ReadChunk(int32_t chunk, absl::Span<uint8_t> out) override;
  int64_t kv_chunk_bytes() const override;
  absl::Status WriteChunk(int32_t chunk, absl::Span<const uint8_t> in) override;

  // Decode graphs captured so far (for tests).
  int num_graphs() const;

  struct Impl;  // device state, opaque

 private:
  CudaLlamaModel(const ModelConfig& config, const ModelOptions& options, const CudaModelOptions& cuda,
                 NcclCommunicator* comm);

  enum class Output {
    kLogits,  // every logits row's logits into *logits
    kGreedy,  // every logits row's greedy pick into the pinned picks
    kSample,  // the samples of packed_ into the pinned picks, in packed_ order
  };
  // Runs the step and leaves its output on the host. With kSample and
  // `late_masks`, the masks are fetched (PackLateMasks) after the layers are
  // launched and uploaded with the sample records.
  absl::Status Run(const ForwardBatch& batch, Output output, std::vector<float>* logits,
                   const LateMasks* late_masks = nullptr);
  // The late masks (per caller's sample) into packed_, in packed_ order.
  absl::Status PackLateMasks(const LateMasks& late_masks);
  // ReadChunk / WriteChunk: chunk `chunk` of every layer's K and V between
  // the device pool and `bytes` of host memory at `host`.
  absl::Status CopyChunk(int32_t chunk, uint8_t* host, size_t bytes, bool to_device);

  ModelConfig config_;
  ModelOptions options_;
  CudaModelOptions cuda_;
  ShardLayout layout_;
  NcclCommunicator* comm_;
  StepRows step_;
  // ForwardSample's samples, sorted by logits row (order_[k] is the caller's
  // index of packed sample k).
  PackedSamples packed_;
  std::vector<int32_t> order_;
  // Per caller's sample, the mask it sampled under (inputs' or the late
  // ones), for the top_logprobs host fallback.
  std::vector<absl::Span<const uint32_t>> allowed_;
  // Per packed sample, its row in top_logits_ or -1: the top_logprobs host
  // fallback's (samples asking for them, vocab) logits rows.
  std::vector<int32_t> top_slot_;
  std::vector<float> top_logits_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_CUDA_LLAMA_H_
