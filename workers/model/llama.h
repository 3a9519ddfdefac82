// The Llama-family decoder on CPU (fp32 arithmetic over fp32, fp16, bf16 or
// weight-only int8 weights, as ModelWeights holds them): token embedding, RMSNorm,
// rotary embedding (with linear / llama3 scaling), grouped-query attention
// through kernels/cpu over this rank's shard of the chunked KV pool, SwiGLU
// MLP, optional q/k/v bias, optional per-head q/k RMSNorm before the rotary
// embedding (Qwen3), tied or untied LM head.
//
// One Forward() is one iteration of the coordinator's schedule: a batch of
// prefill pieces (prefill over chunked KV: a matched prefix already in the
// pool is attended to but never recomputed) and of decode tokens (two-phase
// partition attention over the (C, i, j) context). Projections run over all
// the step's tokens at once: decode rows through cpu::LinearRows, prefill
// rows through OpenBLAS sgemm (16-bit and int8 weights a converted block of
// rows at a time).
//
// Tensor parallelism: each rank runs Forward on the same batch with its own
// weight shard and KV pool; the Communicator all-reduces after o_proj and
// after down_proj, so every rank ends with the same hidden state and logits.
//
// Thread-compatible: one thread drives a model (the worker's thread); it
// parallelizes attention internally over the borrowed ThreadPool.
#ifndef CHUNKATTN_WORKERS_MODEL_LLAMA_H_
#define CHUNKATTN_WORKERS_MODEL_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/model/model_config.h"
#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"
#include "kernels/cpu/attention.h"
#include "base/thread_pool.h"
#include "workers/model/kv_pool.h"
#include "workers/model/model.h"
#include "workers/model/weights.h"

namespace chunkattn {

class Communicator;

class LlamaModel final : public Model {
 public:
  // `comm` (null for a single rank) and `pool` (null for single-threaded
  // attention) are borrowed and must outlive the model; comm's world size
  // must match the weights' layout.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const ModelConfig& config,
                                                            ModelWeights weights,
                                                            const ModelOptions& options,
                                                            Communicator* comm,
                                                            ThreadPool* pool);

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  std::string device() const override { return "cpu"; }
  const ShardLayout& layout() const { return weights_.layout; }
  KvPool& kv_pool() { return *kv_; }

  // Runs one step and writes (batch.logits_rows.size(), vocab) fp32 logits.
  // INVALID_ARGUMENT for a malformed batch (token outside the vocabulary,
  // position past the context, chunk outside the pool, inconsistent sizes),
  // checked before anything is written; the KV of the step's tokens is in the
  // pool afterwards.
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>& logits) override;
  absl::Status CopyKv(absl::Span<const KvCopy> copies) override { return kv_->Copy(copies); }
  absl::Status ReadChunk(int32_t chunk, absl::Span<uint8_t> out) override { return kv_->ReadChunk(chunk, out); }
  int64_t kv_chunk_bytes() const override { return kv_->shape().BytesPerChunk(); }
  absl::Status WriteChunk(int32_t chunk, absl::Span<const uint8_t> in) override {
    return kv_->WriteChunk(chunk, in);
  }
  // Plain copies of one chunk's bytes in every layer: no state a forward
  // pass shares.
  bool chunk_moves_beside_forward() const override { return true; }

 private:
  LlamaModel(const ModelConfig& config, ModelWeights weights, const ModelOptions& options,
             Communicator* comm, ThreadPool* pool);

  absl::Status AllReduce(std::vector<float>& x);
  absl::Status Linear(const float* a, int64_t m, int64_t matrix_rows, int64_t k, const WeightMatrix& w,
                      int64_t n, std::vector<float>& c);
  absl::Status MatrixRows(const float* a, int64_t m, int64_t k, const WeightMatrix& w, int64_t n, float* c);

  ModelConfig config_;
  ModelWeights weights_;
  ModelOptions options_;
  Communicator* comm_;
  ThreadPool* pool_;  // borrowed; null: single-threaded
  std::unique_ptr<KvPool> kv_;
  cpu::CpuAttention attention_;
  std::vector<float> inv_freq_;  // (head_dim / 2) rotary frequencies after scaling

  StepRows step_;

  // Per-step scratch, reused.
  std::vector<float> cos_, sin_;  // (rows, head_dim / 2)
  std::vector<float> x_, h_, qkv_, q_, k_, v_, attn_, out_, gate_up_, act_, rows_;
  std::vector<float> converted_;  // (block, k): 16-bit / int8 weight rows as fp32 for sgemm
};

// Rotary frequencies after rope_scaling, as Hugging Face computes them:
// (head_dim / 2) values theta^(-2i/d), adjusted by the scaling kind.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_LLAMA_H_
