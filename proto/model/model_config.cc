#include "proto/model/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace chunkattn {
namespace {

using Json = nlohmann::json;

// Field readers that never throw: nlohmann's own accessors do on a type
// mismatch, and a malformed config must come back as a status.
class Fields {
 public:
  Fields(const Json& obj, std::string_view source) : obj_(obj), source_(source) {}

  absl::Status Error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field \"%s\" %s", std::string(source_), std::string(field),
                        std::string(what)));
  }

  // An id or a list of ids, each in [0, vocab); absent or null: none.
  absl::StatusOr<std::vector<int32_t>> TokenIds(const char* field, int64_t vocab) const {
    std::vector<int32_t> ids;
    auto it = obj_.find(field);
    if (it == obj_.end() || it->is_null()) return ids;
    const Json list = it->is_array() ? *it : Json::array({*it});
    for (const Json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
        return Error(field, "must be token ids inside the vocabulary");
      }
      ids.push_back(id.get<int32_t>());
    }
    return ids;
  }

  bool Has(const char* field) const {
    auto it = obj_.find(field);
    return it != obj_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> Int(const char* field, int64_t min, int64_t max) const {
    auto it = obj_.find(field);
    if (it == obj_.end() || it->is_null()) return Error(field, "is missing");
    if (!it->is_number_integer()) return Error(field, "must be an integer");
    const int64_t v = it->get<int64_t>();
    if (v < min || v > max) {
      return Error(field, absl::StrFormat("must be in [%d, %d], got %d", min, max, v));
    }
    return v;
  }

  absl::StatusOr<int64_t> IntOr(const char* field, int64_t fallback, int64_t min,
                                int64_t max) const {
    if (!Has(field)) return fallback;
    return Int(field, min, max);
  }

  absl::StatusOr<double> NumberOr(const char* field, double fallback, double min,
                                  double max) const {
    if (!Has(field)) return fallback;
    const Json& v = obj_.at(field);
    if (!v.is_number()) return Error(field, "must be a number");
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < min || d > max) {
      return Error(field, absl::StrFormat("must be in [%g, %g], got %g", min, max, d));
    }
    return d;
  }

  absl::StatusOr<bool> BoolOr(const char* field, bool fallback) const {
    if (!Has(field)) return fallback;
    const Json& v = obj_.at(field);
    if (!v.is_boolean()) return Error(field, "must be true or false");
    return v.get<bool>();
  }

  absl::StatusOr<std::string> StringOr(const char* field, std::string fallback) const {
    if (!Has(field)) return fallback;
    const Json& v = obj_.at(field);
    if (!v.is_string()) return Error(field, "must be a string");
    return v.get<std::string>();
  }

 private:
  const Json& obj_;
  std::string_view source_;
};

constexpr int64_t kMaxDim = 1 << 20;
constexpr int kMaxHeadDim = 1024;

// `node` is "rope_scaling" (transformers 4) or "rope_parameters"
// (transformers 5, which also moves rope_theta there); null means none.
absl::StatusOr<RopeScaling> ParseRopeScaling(const Json* node, const std::string& where) {
  RopeScaling rs;
  if (node == nullptr || node->is_null()) return rs;
  if (!node->is_object()) {
    return absl::InvalidArgumentError(where + ": must be an object or null");
  }
  Fields f(*node, where);
  // Transformers writes "rope_type"; older configs "type".
  ASSIGN_OR_RETURN(std::string kind, f.StringOr("rope_type", ""));
  if (kind.empty()) {
    ASSIGN_OR_RETURN(kind, f.StringOr("type", "default"));
  }
  if (kind == "default") return rs;
  ASSIGN_OR_RETURN(rs.factor, f.NumberOr("factor", 1.0, 1.0, 1e6));
  if (kind == "linear") {
    rs.kind = RopeScalingKind::kLinear;
  } else if (kind == "llama3") {
    rs.kind = RopeScalingKind::kLlama3;
    ASSIGN_OR_RETURN(rs.low_freq_factor, f.NumberOr("low_freq_factor", 1.0, 1e-6, 1e6));
    ASSIGN_OR_RETURN(rs.high_freq_factor, f.NumberOr("high_freq_factor", 4.0, 1e-6, 1e6));
    ASSIGN_OR_RETURN(rs.original_max_position_embeddings,
                     f.Int("original_max_position_embeddings", 1, int64_t{1} << 30));
    if (rs.high_freq_factor <= rs.low_freq_factor) {
      return f.Error("high_freq_factor", "must be greater than low_freq_factor");
    }
  } else {
    return absl::UnimplementedError(
        absl::StrFormat("%s: rope_scaling type \"%s\" is not supported (supported: linear, llama3)",
                        where, kind));
  }
  return rs;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json, std::string_view source) {
  Json root = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: not valid JSON", std::string(source)));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: must be a JSON object", std::string(source)));
  }
  Fields f(root, source);
  ModelConfig c;

  auto arch = root.find("architectures");
  if (arch == root.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
    return f.Error("architectures", "must be a non-empty list of strings");
  }
  c.architecture = (*arch)[0].get<std::string>();
  ASSIGN_OR_RETURN(c.model_type, f.StringOr("model_type", ""));
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  // Qwen2 always has q/k/v biases (transformers ignores an attention_bias
  // field there); Qwen3 reads attention_bias (default false) and always has
  // q/k norms.
  c.qk_norm = qwen3;
  if (!qwen2 && !qwen3 && c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM") {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: architecture \"%s\" is not supported (supported: LlamaForCausalLM, "
        "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
        std::string(source), c.architecture));
  }

  ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size", 1, int64_t{1} << 24));
  ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size", 1, kMaxDim));
  ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", 1, kMaxDim));
  ASSIGN_OR_RETURN(c.num_layers, f.Int("num_hidden_layers", 1, 4096));
  ASSIGN_OR_RETURN(c.num_heads, f.Int("num_attention_heads", 1, 4096));
  ASSIGN_OR_RETURN(c.num_kv_heads, f.IntOr("num_key_value_heads", c.num_heads, 1, 4096));
  if (c.num_heads % c.num_kv_heads != 0) {
    return f.Error("num_key_value_heads",
                   absl::StrFormat("must divide num_attention_heads (%d), got %d", c.num_heads,
                                   c.num_kv_heads));
  }
  if (f.Has("head_dim")) {
    ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", 1, kMaxHeadDim));
  } else if (qwen3) {
    c.head_dim = 128;  // Qwen3Config's default, not hidden_size / num_heads
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return f.Error("hidden_size", "must be a multiple of num_attention_heads");
    }
    c.head_dim = c.hidden_size / c.num_heads;
    // The bound an explicit head_dim has (the fuzzer found a derived one
    // escaping it, so the config's own JSON did not parse again).
    if (c.head_dim > kMaxHeadDim) {
      return f.Error("hidden_size", absl::StrFormat("/ num_attention_heads gives head_dim %d; at most %d",
                                                    c.head_dim, kMaxHeadDim));
    }
  }
  if (c.head_dim % 2 != 0) return f.Error("head_dim", "must be even (rotary embedding)");
  ASSIGN_OR_RETURN(c.rms_norm_eps, f.NumberOr("rms_norm_eps", 1e-6, 0.0, 1.0));
  ASSIGN_OR_RETURN(c.rope_theta, f.NumberOr("rope_theta", 10000.0, 1.0, 1e12));
  auto params = root.find("rope_parameters");
  if (params != root.end() && params->is_object()) {
    const std::string where = std::string(source) + " rope_parameters";
    ASSIGN_OR_RETURN(c.rope_theta, Fields(*params, where).NumberOr("rope_theta", c.rope_theta, 1.0, 1e12));
    ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(&*params, where));
  } else {
    auto scaling = root.find("rope_scaling");
    ASSIGN_OR_RETURN(c.rope_scaling,
                     ParseRopeScaling(scaling == root.end() ? nullptr : &*scaling,
                                      std::string(source) + " rope_scaling"));
  }
  ASSIGN_OR_RETURN(c.max_context, f.IntOr("max_position_embeddings", 2048, 1, int64_t{1} << 24));
  ASSIGN_OR_RETURN(int64_t window, f.IntOr("sliding_window", 0, 0, int64_t{1} << 30));
  ASSIGN_OR_RETURN(bool use_window, f.BoolOr("use_sliding_window", !qwen2 && !qwen3));
  if (use_window && window > 0 && window < c.max_context) {
    if (qwen2 || qwen3) {
      // Qwen2 and Qwen3 apply the window to the top layers only: not the
      // same model with a shorter context.
      return absl::UnimplementedError(absl::StrFormat(
          "%s: %s with use_sliding_window is not supported", std::string(source), qwen2 ? "Qwen2" : "Qwen3"));
    }
    c.max_context = window;  // full attention is exact up to the window
  }
  ASSIGN_OR_RETURN(c.tie_word_embeddings, f.BoolOr("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(c.attention_bias, f.BoolOr("attention_bias", false));
  if (qwen2) c.attention_bias = true;
  ASSIGN_OR_RETURN(bool mlp_bias, f.BoolOr("mlp_bias", false));
  if (mlp_bias) {
    return absl::UnimplementedError(
        absl::StrFormat("%s: mlp_bias is not supported", std::string(source)));
  }
  ASSIGN_OR_RETURN(std::string act, f.StringOr("hidden_act", "silu"));
  if (act != "silu") {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: hidden_act \"%s\" is not supported (only silu)", std::string(source), act));
  }
  ASSIGN_OR_RETURN(std::string dtype, f.StringOr("torch_dtype", ""));
  if (dtype.empty()) {
    ASSIGN_OR_RETURN(dtype, f.StringOr("dtype", "float32"));
  }
  auto parsed = ParseDType(dtype);
  if (!parsed) return f.Error("torch_dtype", "must be float32, float16 or bfloat16, got " + dtype);
  c.dtype = *parsed;
  ASSIGN_OR_RETURN(c.bos_token_id, f.IntOr("bos_token_id", -1, -1, c.vocab_size - 1));
  ASSIGN_OR_RETURN(c.eos_token_ids, f.TokenIds("eos_token_id", c.vocab_size));
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("%s: cannot open", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text.str(), path);
  if (!config.ok()) return config;
  // generation_config.json's eos_token_id is what generation stops on in
  // transformers (Llama 3 instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>).
  const std::string gen_path = dir + "/generation_config.json";
  absl::StatusOr<std::string> gen_text = ReadFileToString(gen_path);
  if (absl::IsNotFound(gen_text.status())) return config;
  if (!gen_text.ok()) return absl::InvalidArgumentError(gen_text.status().message());
  const Json root = Json::parse(*gen_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: not a JSON object", gen_path));
  }
  const Fields f(root, gen_path);
  if (!f.Has("eos_token_id")) return config;
  ASSIGN_OR_RETURN(config->eos_token_ids, f.TokenIds("eos_token_id", config->vocab_size));
  return config;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  Json j;
  j["architectures"] = Json::array({c.architecture});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = c.max_context;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  // Qwen2's bias is implied by the architecture, as is Qwen3's qk_norm.
  if (c.architecture != "Qwen2ForCausalLM") j["attention_bias"] = c.attention_bias;
  j["torch_dtype"] = c.dtype == DType::kFloat32   ? "float32"
                     : c.dtype == DType::kFloat16 ? "float16"
                                                  : "bfloat16";
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  switch (c.rope_scaling.kind) {
    case RopeScalingKind::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScalingKind::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScalingKind::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  return j.dump(2) + "\n";
}

}  // namespace chunkattn
