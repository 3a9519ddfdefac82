#include "workers/model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/hash.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "workers/model/safetensors.h"

namespace chunkattn {
namespace {

// Where tensors come from. Fill() writes rows [r0, r0 + rows) x columns
// [c0, c0 + cols) of the tensor `name`, whose whole shape is `shape` (a
// vector is one column), into `out` (rows x cols, row-major).
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool Has(const std::string& name) const = 0;
  virtual absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape,
                            int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                            float* out) const = 0;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

class SafetensorsSource : public TensorSource {
 public:
  explicit SafetensorsSource(std::unique_ptr<SafetensorsModel> model) : model_(std::move(model)) {}

  bool Has(const std::string& name) const override { return model_->Has(name); }

  absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape, int64_t r0,
                    int64_t rows, int64_t c0, int64_t cols, float* out) const override {
    ASSIGN_OR_RETURN(TensorView t, model_->Get(name));
    if (t.shape != shape) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tensor \"%s\" has shape %s, the config needs %s", t.file, name,
          ShapeString(t.shape), ShapeString(shape)));
    }
    const int64_t width = shape.size() == 2 ? shape[1] : 1;
    for (int64_t r = 0; r < rows; ++r) ToFloat(t, (r0 + r) * width + c0, cols, out + r * cols);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<SafetensorsModel> model_;
};

class DummySource : public TensorSource {
 public:
  explicit DummySource(uint64_t seed) : seed_(seed) {}

  bool Has(const std::string&) const override { return true; }

  absl::Status Fill(const std::string& name, const std::vector<int64_t>& shape, int64_t r0,
                    int64_t rows, int64_t c0, int64_t cols, float* out) const override {
    const int64_t width = shape.size() == 2 ? shape[1] : 1;
    if (name.find("norm") != std::string::npos) {
      std::fill(out, out + rows * cols, 1.0f);
      return absl::OkStatus();
    }
    // Uniform with the wanted standard deviation: half-width sqrt(3) * std.
    double std = 1.0;
    if (name.find("bias") != std::string::npos) {
      std = 0.1;
    } else if (name.find("embed_tokens") == std::string::npos) {
      std = 1.0 / std::sqrt(static_cast<double>(width));
    }
    const double half_width = std::sqrt(3.0) * std;
    uint64_t h = SplitMix64(seed_);
    for (unsigned char ch : name) h = SplitMix64(h ^ ch);
    auto fill_rows = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const uint64_t bits = SplitMix64(h + static_cast<uint64_t>((r0 + r) * width + c0 + c));
          const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
          out[r * cols + c] = static_cast<float>((2 * u - 1) * half_width);
        }
      }
    };
    // A 7B model is 6.7e9 draws: spread large tensors over the cores (each
    // element depends only on its index, so the split changes nothing).
    const int64_t threads =
        rows * cols < (int64_t{1} << 22) ? 1 : std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32);
    if (threads == 1) {
      fill_rows(0, rows);
      return absl::OkStatus();
    }
    std::vector<std::thread> pool;
    const int64_t per = (rows + threads - 1) / threads;
    for (int64_t t = 0; t < threads; ++t) {
      pool.emplace_back(fill_rows, std::min(rows, t * per), std::min(rows, (t + 1) * per));
    }
    for (auto& t : pool) t.join();
    return absl::OkStatus();
  }

 private:
  uint64_t seed_;
};

// Appends rows [r0, r0 + rows) x columns [c0, c0 + cols) of `name` to `dst`.
absl::Status Append(const TensorSource& src, const std::string& name,
                    const std::vector<int64_t>& shape, int64_t r0, int64_t rows, int64_t c0,
                    int64_t cols, std::vector<float>& dst) {
  const size_t at = dst.size();
  dst.resize(at + static_cast<size_t>(rows * cols));
  return src.Fill(name, shape, r0, rows, c0, cols, dst.data() + at);
}

absl::Status AppendRows(const TensorSource& src, const std::string& name,
                        const std::vector<int64_t>& shape, int64_t r0, int64_t rows,
                        std::vector<float>& dst) {
  return Append(src, name, shape, r0, rows, 0, shape.size() == 2 ? shape[1] : 1, dst);
}

absl::StatusOr<ModelWeights> Build(const ModelConfig& c, ShardSpec shard, const TensorSource& src) {
  ModelWeights w;
  ASSIGN_OR_RETURN(w.layout, MakeShardLayout(c, shard));
  const ShardLayout& l = w.layout;
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const int64_t vocab = c.vocab_size;
  RETURN_IF_ERROR(AppendRows(src, "model.embed_tokens.weight", {vocab, hidden}, 0, vocab, w.embed));
  RETURN_IF_ERROR(AppendRows(src, "model.norm.weight", {hidden}, 0, hidden, w.final_norm));
  if (!c.tie_word_embeddings) {
    RETURN_IF_ERROR(AppendRows(src, "lm_head.weight", {vocab, hidden}, 0, vocab, w.lm_head));
  }
  const int64_t q_rows = int64_t{c.num_heads} * d, kv_rows = int64_t{c.num_kv_heads} * d;
  const int64_t inter = c.intermediate_size;
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrFormat("model.layers.%d.", i);
    LayerWeights& lw = w.layers[i];
    RETURN_IF_ERROR(AppendRows(src, p + "input_layernorm.weight", {hidden}, 0, hidden,
                               lw.input_norm));
    RETURN_IF_ERROR(AppendRows(src, p + "post_attention_layernorm.weight", {hidden}, 0, hidden,
                               lw.post_norm));
    const int64_t q0 = l.head_begin * d, qn = l.num_heads * d;
    const int64_t kv0 = l.kv_head_begin * d, kvn = l.num_kv_heads * d;
    RETURN_IF_ERROR(AppendRows(src, p + "self_attn.q_proj.weight", {q_rows, hidden}, q0, qn, lw.qkv));
    RETURN_IF_ERROR(AppendRows(src, p + "self_attn.k_proj.weight", {kv_rows, hidden}, kv0, kvn, lw.qkv));
    RETURN_IF_ERROR(AppendRows(src, p + "self_attn.v_proj.weight", {kv_rows, hidden}, kv0, kvn, lw.qkv));
    if (c.attention_bias) {
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.q_proj.bias", {q_rows}, q0, qn, lw.qkv_bias));
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.k_proj.bias", {kv_rows}, kv0, kvn, lw.qkv_bias));
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.v_proj.bias", {kv_rows}, kv0, kvn, lw.qkv_bias));
    }
    if (c.qk_norm) {
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.q_norm.weight", {d}, 0, d, lw.q_norm));
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.k_norm.weight", {d}, 0, d, lw.k_norm));
    }
    RETURN_IF_ERROR(Append(src, p + "self_attn.o_proj.weight", {hidden, q_rows}, 0, hidden, q0, qn, lw.o));
    RETURN_IF_ERROR(AppendRows(src, p + "mlp.gate_proj.weight", {inter, hidden},
                               l.intermediate_begin, l.intermediate, lw.gate_up));
    RETURN_IF_ERROR(AppendRows(src, p + "mlp.up_proj.weight", {inter, hidden},
                               l.intermediate_begin, l.intermediate, lw.gate_up));
    RETURN_IF_ERROR(Append(src, p + "mlp.down_proj.weight", {hidden, inter}, 0, hidden,
                           l.intermediate_begin, l.intermediate, lw.down));
  }
  return w;
}

std::vector<uint8_t> Encode(const float* x, int64_t n, DType dtype) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * DTypeBytes(dtype));
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, x + i, 4);
    } else {
      const uint16_t h = dtype == DType::kFloat16 ? FloatToHalf(x[i]) : FloatToBFloat16(x[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

}  // namespace

absl::StatusOr<ShardLayout> MakeShardLayout(const ModelConfig& c, ShardSpec shard) {
  const int n = shard.world_size, r = shard.rank;
  if (n < 1 || r < 0 || r >= n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor-parallel rank %d of world size %d is not valid", r, n));
  }
  if (c.num_heads % n != 0 || c.intermediate_size % n != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor-parallel size %d must divide num_attention_heads (%d) and intermediate_size (%d)",
        n, c.num_heads, c.intermediate_size));
  }
  if (c.num_kv_heads % n != 0 && n % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor-parallel size %d must divide num_key_value_heads (%d) or be a multiple of it", n,
        c.num_kv_heads));
  }
  ShardLayout l;
  l.rank = r;
  l.world_size = n;
  l.num_heads = c.num_heads / n;
  l.head_begin = r * l.num_heads;
  if (c.num_kv_heads >= n) {
    l.num_kv_heads = c.num_kv_heads / n;
    l.kv_head_begin = r * l.num_kv_heads;
  } else {  // replicated: ranks [k * n/kv, (k+1) * n/kv) all hold KV head k
    l.num_kv_heads = 1;
    l.kv_head_begin = r / (n / c.num_kv_heads);
  }
  l.intermediate = c.intermediate_size / n;
  l.intermediate_begin = r * l.intermediate;
  return l;
}

absl::StatusOr<ModelWeights> LoadWeights(const std::string& dir, const ModelConfig& config,
                                         ShardSpec shard) {
  ASSIGN_OR_RETURN(auto model, SafetensorsModel::Open(dir));
  SafetensorsSource source(std::move(model));
  return Build(config, shard, source);
}

absl::StatusOr<ModelWeights> DummyWeights(const ModelConfig& config, ShardSpec shard,
                                          uint64_t seed) {
  DummySource source(seed);
  return Build(config, shard, source);
}

absl::Status SaveModel(const std::string& dir, const ModelConfig& c, const ModelWeights& w,
                       DType dtype, int64_t max_shard_bytes) {
  if (w.layout.world_size != 1) {
    return absl::InvalidArgumentError("SaveModel needs the whole model (world size 1)");
  }
  {
    std::ofstream cfg(dir + "/config.json", std::ios::trunc);
    if (!cfg) return absl::PermissionDeniedError(absl::StrFormat("%s/config.json: cannot create", dir));
    cfg << ModelConfigToJson(c);
    if (!cfg) return absl::DataLossError(absl::StrFormat("%s/config.json: write failed", dir));
  }
  const int64_t hidden = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q_rows = int64_t{c.num_heads} * d, kv_rows = int64_t{c.num_kv_heads} * d;
  std::vector<TensorToWrite> tensors;
  auto add = [&](std::string name, std::vector<int64_t> shape, const float* x) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    tensors.push_back({std::move(name), dtype, std::move(shape), Encode(x, n, dtype)});
  };
  add("model.embed_tokens.weight", {c.vocab_size, hidden}, w.embed.data());
  add("model.norm.weight", {hidden}, w.final_norm.data());
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, hidden}, w.lm_head.data());
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrFormat("model.layers.%d.", i);
    const LayerWeights& lw = w.layers[i];
    add(p + "input_layernorm.weight", {hidden}, lw.input_norm.data());
    add(p + "post_attention_layernorm.weight", {hidden}, lw.post_norm.data());
    add(p + "self_attn.q_proj.weight", {q_rows, hidden}, lw.qkv.data());
    add(p + "self_attn.k_proj.weight", {kv_rows, hidden}, lw.qkv.data() + q_rows * hidden);
    add(p + "self_attn.v_proj.weight", {kv_rows, hidden},
        lw.qkv.data() + (q_rows + kv_rows) * hidden);
    if (c.attention_bias) {
      add(p + "self_attn.q_proj.bias", {q_rows}, lw.qkv_bias.data());
      add(p + "self_attn.k_proj.bias", {kv_rows}, lw.qkv_bias.data() + q_rows);
      add(p + "self_attn.v_proj.bias", {kv_rows}, lw.qkv_bias.data() + q_rows + kv_rows);
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {d}, lw.q_norm.data());
      add(p + "self_attn.k_norm.weight", {d}, lw.k_norm.data());
    }
    add(p + "self_attn.o_proj.weight", {hidden, q_rows}, lw.o.data());
    add(p + "mlp.gate_proj.weight", {inter, hidden}, lw.gate_up.data());
    add(p + "mlp.up_proj.weight", {inter, hidden}, lw.gate_up.data() + inter * hidden);
    add(p + "mlp.down_proj.weight", {hidden, inter}, lw.down.data());
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (max_shard_bytes <= 0) {
    return WriteSafetensors(dir + "/model.safetensors", tensors, metadata);
  }
  // Greedy shards in tensor order, as save_pretrained does.
  std::vector<std::vector<TensorToWrite>> shards(1);
  int64_t bytes = 0;
  for (TensorToWrite& t : tensors) {
    const int64_t size = static_cast<int64_t>(t.bytes.size());
    if (bytes > 0 && bytes + size > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    bytes += size;
    shards.back().push_back(std::move(t));
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  int64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    for (const TensorToWrite& t : shards[s]) {
      index["weight_map"][t.name] = file;
      total += static_cast<int64_t>(t.bytes.size());
    }
    RETURN_IF_ERROR(WriteSafetensors(dir + "/" + file, shards[s], metadata));
  }
  index["metadata"]["total_size"] = total;
  std::ofstream out(dir + "/model.safetensors.index.json", std::ios::trunc);
  out << index.dump(2) << "\n";
  if (!out) return absl::DataLossError(absl::StrFormat("%s: cannot write the index", dir));
  return absl::OkStatus();
}

}  // namespace chunkattn
