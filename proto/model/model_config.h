// The Hugging Face config.json of a Llama-family decoder (Llama 2/3, Mistral,
// Qwen2, Qwen3, TinyLlama), parsed and validated once at load time.
#ifndef CHUNKATTN_PROTO_MODEL_MODEL_CONFIG_H_
#define CHUNKATTN_PROTO_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/api/dtype.h"

namespace chunkattn {

// rope_scaling kinds we implement. "linear" divides every frequency by
// `factor`; "llama3" (Llama 3.1+) divides only the low frequencies and blends
// the band between low_freq_factor and high_freq_factor.
enum class RopeScalingKind { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // e.g. "llama"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // config "head_dim", else hidden_size / num_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Longest context, tokens: max_position_embeddings, capped by a sliding
  // window (Mistral v0.1) because we attend to the whole context.
  int64_t max_context = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2 always)
  // Per-head RMSNorm of q and of k after their projections (and bias), before
  // the rotary embedding: weights self_attn.q_norm / k_norm, (head_dim) each,
  // eps rms_norm_eps. True exactly for Qwen3ForCausalLM (transformers has no
  // config field for it), so ModelConfigToJson carries it as the architecture.
  bool qk_norm = false;
  DType dtype = DType::kFloat32;  // "torch_dtype" (or "dtype"); weights may differ per tensor
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
};

// Parses config.json text. INVALID_ARGUMENT (naming `source` and the field)
// for missing or out-of-range fields; UNIMPLEMENTED for architectures or
// options we do not run (another rope_scaling kind, MLP bias, a sliding
// window used by some layers only).
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json, std::string_view source);

// Reads and parses `dir`/config.json; the eos_token_id of
// `dir`/generation_config.json, when it has one, replaces config.json's (the
// tokens transformers' generate stops on). INVALID_ARGUMENT naming
// generation_config.json when it is not JSON or its ids are out of range.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// The config as Hugging Face writes it (for the demo model and tests).
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace chunkattn

#endif  // CHUNKATTN_PROTO_MODEL_MODEL_CONFIG_H_
