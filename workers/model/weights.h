// A Llama-family model's weights for one tensor-parallel rank, as fp32 on the
// host: loaded from Hugging Face safetensors (fp32/fp16/bf16, one file or
// sharded) or made up from a seed ("dummy" weights for benchmarks).
//
// Tensor parallelism (Megatron style): rank r of n holds query heads
// [r*h/n, (r+1)*h/n) and the matching KV heads, columns of q/k/v and of
// gate/up, and the matching input columns of o_proj and down_proj, so one
// all-reduce after o_proj and one after down_proj give every rank the full
// hidden state. When n exceeds the KV head count, each KV head is
// replicated on n/kv ranks (as vLLM does). Embedding, LM head, the norms and
// Qwen3's q/k norms (over head_dim, shared by all heads) are whole on every
// rank.
#ifndef CHUNKATTN_WORKERS_MODEL_WEIGHTS_H_
#define CHUNKATTN_WORKERS_MODEL_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/model/model_config.h"
#include "kernels/api/dtype.h"

namespace chunkattn {

struct ShardSpec {
  int rank = 0;
  int world_size = 1;
};

// This rank's slice of heads and MLP.
struct ShardLayout {
  int rank = 0;
  int world_size = 1;
  int num_heads = 0;        // local query heads
  int head_begin = 0;       // first global query head
  int num_kv_heads = 0;     // local KV heads
  int kv_head_begin = 0;    // first global KV head
  int intermediate = 0;     // local MLP width
  int intermediate_begin = 0;
};

// INVALID_ARGUMENT unless the model splits evenly over `shard.world_size`.
absl::StatusOr<ShardLayout> MakeShardLayout(const ModelConfig& config, ShardSpec shard);

// Row-major fp32 matrices, (out_features, in_features) as in PyTorch.
struct LayerWeights {
  std::vector<float> input_norm;  // (hidden)
  std::vector<float> qkv;         // (q_local + 2 * kv_local, hidden): q rows, k rows, v rows
  std::vector<float> qkv_bias;    // (q_local + 2 * kv_local), empty without attention_bias
  std::vector<float> q_norm;      // (head_dim), empty without qk_norm
  std::vector<float> k_norm;      // (head_dim), empty without qk_norm
  std::vector<float> o;           // (hidden, q_local): this rank's input columns
  std::vector<float> post_norm;   // (hidden)
  std::vector<float> gate_up;     // (2 * intermediate_local, hidden): gate rows, then up rows
  std::vector<float> down;        // (hidden, intermediate_local)
};

struct ModelWeights {
  ShardLayout layout;
  std::vector<float> embed;       // (vocab, hidden)
  std::vector<float> final_norm;  // (hidden)
  std::vector<float> lm_head;     // (vocab, hidden); empty when tied to embed
  std::vector<LayerWeights> layers;

  const std::vector<float>& output_embedding() const {
    return lm_head.empty() ? embed : lm_head;
  }
};

// Loads `dir` (model.safetensors or model.safetensors.index.json + shards).
// Every tensor's presence, shape and dtype is checked; errors name the file
// and the tensor.
absl::StatusOr<ModelWeights> LoadWeights(const std::string& dir, const ModelConfig& config,
                                         ShardSpec shard);

// Seeded random weights: every element is a hash of (seed, tensor name,
// element index), so any shard equals the same slice of the whole model.
// Linear weights have std 1/sqrt(fan_in), embeddings std 1, norms 1.
absl::StatusOr<ModelWeights> DummyWeights(const ModelConfig& config, ShardSpec shard,
                                          uint64_t seed);

// Writes config.json and the weights of an unsharded model (world_size 1) as
// Hugging Face names them, in `dtype`: model.safetensors, or shards of at most
// `max_shard_bytes` with model.safetensors.index.json when that is > 0.
absl::Status SaveModel(const std::string& dir, const ModelConfig& config,
                       const ModelWeights& weights, DType dtype, int64_t max_shard_bytes = 0);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_WEIGHTS_H_
