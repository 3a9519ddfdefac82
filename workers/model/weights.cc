#include "workers/model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/hash.h"
#include "base/status_macros.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/int8_layout.h"
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
  // The dtype `name` is stored in (what WeightDType::kAuto keeps).
  virtual absl::StatusOr<DType> DTypeOf(const std::string& name) const = 0;
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

  absl::StatusOr<DType> DTypeOf(const std::string& name) const override {
    ASSIGN_OR_RETURN(TensorView t, model_->Get(name));
    return t.dtype;
  }

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
  DummySource(uint64_t seed, DType dtype) : seed_(seed), dtype_(dtype) {}

  bool Has(const std::string&) const override { return true; }
  absl::StatusOr<DType> DTypeOf(const std::string&) const override { return dtype_; }

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
  DType dtype_;  // what the checkpoint would hold: the config's torch_dtype
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

// Rows [r0, r0 + rows) x columns [c0, c0 + cols) of a 2-D tensor: a slice of
// one matrix, stacked under the parts before it.
struct Part {
  std::string name;
  std::vector<int64_t> shape;
  int64_t r0 = 0, rows = 0, c0 = 0, cols = 0;
};

Part RowsOf(std::string name, std::vector<int64_t> shape, int64_t r0, int64_t rows) {
  const int64_t cols = shape[1];
  return {std::move(name), std::move(shape), r0, rows, 0, cols};
}

WeightDType FromDType(DType t) {
  switch (t) {
    case DType::kFloat32: return WeightDType::kFloat32;
    case DType::kFloat16: return WeightDType::kFloat16;
    case DType::kBFloat16: return WeightDType::kBFloat16;
  }
  return WeightDType::kFloat32;
}

// The matrix of `parts` stacked, in `want` (kAuto: the parts' common 16-bit
// dtype, else fp32). Other than fp32, it is filled a block of rows at a time
// through one fp32 buffer, so the model is never whole in fp32.
absl::StatusOr<WeightMatrix> BuildMatrix(const TensorSource& src, WeightDType want,
                                         const std::vector<Part>& parts) {
  int64_t rows = 0;
  for (const Part& p : parts) rows += p.rows;
  const int64_t cols = parts.front().cols;
  if (want == WeightDType::kAuto) {
    ASSIGN_OR_RETURN(DType first, src.DTypeOf(parts.front().name));
    want = FromDType(first);
    for (const Part& p : parts) {
      ASSIGN_OR_RETURN(DType t, src.DTypeOf(p.name));
      if (t != first) want = WeightDType::kFloat32;
    }
  }
  WeightMatrix m = WeightMatrix::Zeros(want, rows, cols);
  // 4M values (16 MB) a block: large enough that DummySource spreads a
  // block over the cores.
  const int64_t block_rows = std::max<int64_t>(1, (int64_t{1} << 22) / std::max<int64_t>(cols, 1));
  std::vector<float> buffer;
  int64_t at = 0;
  for (const Part& p : parts) {
    if (want == WeightDType::kFloat32) {
      RETURN_IF_ERROR(src.Fill(p.name, p.shape, p.r0, p.rows, p.c0, p.cols, m.f32.data() + at * cols));
    } else {
      for (int64_t r = 0; r < p.rows; r += block_rows) {
        const int64_t n = std::min(block_rows, p.rows - r);
        buffer.resize(static_cast<size_t>(n * cols));
        RETURN_IF_ERROR(src.Fill(p.name, p.shape, p.r0 + r, n, p.c0, p.cols, buffer.data()));
        m.SetRows(at + r, n, buffer.data());
      }
    }
    at += p.rows;
  }
  return m;
}

absl::StatusOr<ModelWeights> Build(const ModelConfig& c, ShardSpec shard, const TensorSource& src,
                                   WeightDType dtype) {
  ModelWeights w;
  ASSIGN_OR_RETURN(w.layout, MakeShardLayout(c, shard));
  const ShardLayout& l = w.layout;
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const int64_t vocab = c.vocab_size;
  ASSIGN_OR_RETURN(w.embed, BuildMatrix(src, dtype, {RowsOf("model.embed_tokens.weight", {vocab, hidden}, 0, vocab)}));
  RETURN_IF_ERROR(AppendRows(src, "model.norm.weight", {hidden}, 0, hidden, w.final_norm));
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(w.lm_head, BuildMatrix(src, dtype, {RowsOf("lm_head.weight", {vocab, hidden}, 0, vocab)}));
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
    ASSIGN_OR_RETURN(lw.qkv, BuildMatrix(src, dtype,
                                         {RowsOf(p + "self_attn.q_proj.weight", {q_rows, hidden}, q0, qn),
                                          RowsOf(p + "self_attn.k_proj.weight", {kv_rows, hidden}, kv0, kvn),
                                          RowsOf(p + "self_attn.v_proj.weight", {kv_rows, hidden}, kv0, kvn)}));
    if (c.attention_bias) {
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.q_proj.bias", {q_rows}, q0, qn, lw.qkv_bias));
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.k_proj.bias", {kv_rows}, kv0, kvn, lw.qkv_bias));
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.v_proj.bias", {kv_rows}, kv0, kvn, lw.qkv_bias));
    }
    if (c.qk_norm) {
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.q_norm.weight", {d}, 0, d, lw.q_norm));
      RETURN_IF_ERROR(AppendRows(src, p + "self_attn.k_norm.weight", {d}, 0, d, lw.k_norm));
    }
    ASSIGN_OR_RETURN(lw.o, BuildMatrix(src, dtype,
                                       {{p + "self_attn.o_proj.weight", {hidden, q_rows}, 0, hidden, q0, qn}}));
    const int64_t i0 = l.intermediate_begin, in = l.intermediate;
    ASSIGN_OR_RETURN(lw.gate_up, BuildMatrix(src, dtype,
                                             {RowsOf(p + "mlp.gate_proj.weight", {inter, hidden}, i0, in),
                                              RowsOf(p + "mlp.up_proj.weight", {inter, hidden}, i0, in)}));
    ASSIGN_OR_RETURN(lw.down, BuildMatrix(src, dtype,
                                          {{p + "mlp.down_proj.weight", {hidden, inter}, 0, hidden,
                                            l.intermediate_begin, l.intermediate}}));
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

absl::StatusOr<WeightDType> ParseWeightDType(std::string_view s) {
  if (s == "auto") return WeightDType::kAuto;
  if (s == "int8") return WeightDType::kInt8;
  if (std::optional<DType> t = ParseDType(s)) return FromDType(*t);
  return absl::InvalidArgumentError(absl::StrFormat(
      "weight dtype \"%s\": must be auto, float32, float16, bfloat16 or int8", s));
}

const char* WeightDTypeName(WeightDType t) {
  switch (t) {
    case WeightDType::kAuto: return "auto";
    case WeightDType::kFloat32: return "float32";
    case WeightDType::kFloat16: return "float16";
    case WeightDType::kBFloat16: return "bfloat16";
    case WeightDType::kInt8: return "int8";
  }
  return "?";
}

WeightMatrix WeightMatrix::Zeros(WeightDType dtype, int64_t rows, int64_t cols) {
  WeightMatrix m;
  m.dtype = dtype;
  m.rows = rows;
  m.cols = cols;
  const size_t n = static_cast<size_t>(rows * cols);
  switch (dtype) {
    case WeightDType::kAuto:  // never a matrix's dtype: fp32
      m.dtype = WeightDType::kFloat32;
      m.f32.assign(n, 0.0f);
      break;
    case WeightDType::kFloat32: m.f32.assign(n, 0.0f); break;
    case WeightDType::kFloat16:
    case WeightDType::kBFloat16: m.half.assign(n, 0); break;
    case WeightDType::kInt8:
      m.block = cols > 0 && cols % kInt8Block == 0 ? kInt8Block : std::max<int64_t>(cols, 1);
      m.interleaved = cpu::Int8Interleaves(rows, cols, m.block);
      m.q.assign(n, 0);
      m.scales.assign(static_cast<size_t>(rows * (cols / m.block)), 0);
      break;
  }
  return m;
}

cpu::WeightView WeightMatrix::View() const {
  cpu::WeightView v;
  switch (dtype) {
    case WeightDType::kAuto:
    case WeightDType::kFloat32:
      v.data = f32.data();
      v.dtype = DType::kFloat32;
      break;
    case WeightDType::kFloat16:
    case WeightDType::kBFloat16:
      v.data = half.data();
      v.dtype = dtype == WeightDType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
      break;
    case WeightDType::kInt8:
      v.data = q.data();
      v.scales = scales.data();
      v.block = block;
      v.interleaved = interleaved;
      break;
  }
  v.packed = packed;
  return v;
}

int64_t WeightMatrix::bytes() const {
  return static_cast<int64_t>(f32.size() * 4 + half.size() * 2 + q.size() + scales.size() * 2);
}

int64_t WeightMatrix::StoredAt(int64_t i) const {
  return interleaved ? cpu::Int8InterleavedIndex(i / cols, i % cols, cols) : i;
}

bool WeightMatrix::Pack() {
  if (packed || dtype == WeightDType::kInt8 || !cpu::Packs(rows, cols)) return false;
  const auto pack = [&](auto& values) {
    std::remove_reference_t<decltype(values)> p(values.size());
    cpu::PackRows(values.data(), 0, rows, cols, p.data());
    values = std::move(p);
  };
  if (dtype == WeightDType::kFloat16 || dtype == WeightDType::kBFloat16) {
    pack(half);
  } else {
    pack(f32);
  }
  packed = true;
  return true;
}

void WeightMatrix::RowsToFloat(int64_t r0, int64_t n, float* out) const {
  const int64_t begin = r0 * cols, count = n * cols;
  // Packed 16-bit rows: back to row order into `out`'s own bits first.
  std::vector<uint16_t> unpacked;
  const uint16_t* h = half.empty() ? nullptr : half.data() + begin;
  if (packed && h != nullptr) {
    unpacked.resize(static_cast<size_t>(count));
    cpu::UnpackRows(half.data(), r0, n, cols, unpacked.data());
    h = unpacked.data();
  }
  switch (dtype) {
    case WeightDType::kAuto:
    case WeightDType::kFloat32:
      if (packed) return cpu::UnpackRows(f32.data(), r0, n, cols, out);
      std::copy_n(f32.data() + begin, count, out);
      return;
    case WeightDType::kFloat16:
      for (int64_t i = 0; i < count; ++i) out[i] = HalfToFloat(h[i]);
      return;
    case WeightDType::kBFloat16:
      for (int64_t i = 0; i < count; ++i) out[i] = BFloat16ToFloat(h[i]);
      return;
    case WeightDType::kInt8:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = static_cast<float>(q[StoredAt(begin + i)]) * HalfToFloat(scales[(begin + i) / block]);
      }
      return;
  }
}

std::vector<float> WeightMatrix::ToFloat() const {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  RowsToFloat(0, rows, out.data());
  return out;
}

void WeightMatrix::SetRows(int64_t r0, int64_t n, const float* src) {
  // Rows [a, b) of the n.
  auto set = [&](int64_t a, int64_t b) {
    const int64_t begin = (r0 + a) * cols, count = (b - a) * cols;
    const float* x = src + a * cols;
    // Packed 16-bit rows: rounded into row order, then packed.
    std::vector<uint16_t> rounded;
    uint16_t* h = half.empty() ? nullptr : half.data() + begin;
    if (packed && h != nullptr) {
      rounded.resize(static_cast<size_t>(count));
      h = rounded.data();
    }
    switch (dtype) {
      case WeightDType::kAuto:
      case WeightDType::kFloat32:
        if (packed) return cpu::PackRows(x, r0 + a, b - a, cols, f32.data());
        std::copy_n(x, count, f32.data() + begin);
        return;
      case WeightDType::kFloat16:
      case WeightDType::kBFloat16:
        for (int64_t i = 0; i < count; ++i) {
          h[i] = dtype == WeightDType::kFloat16 ? FloatToHalf(x[i]) : FloatToBFloat16(x[i]);
        }
        if (packed) cpu::PackRows(h, r0 + a, b - a, cols, half.data());
        return;
      case WeightDType::kInt8:
        // Symmetric, round to nearest: |error| <= scale / 2, about max|w| / 254
        // per block (the fp16 scale is at most 2^-10 over max|w| / 127).
        for (int64_t b0 = 0; b0 < count; b0 += block) {
          float amax = 0;
          for (int64_t i = b0; i < b0 + block; ++i) amax = std::max(amax, std::fabs(x[i]));
          const uint16_t s16 = cpu::Int8Scale(amax);
          const float scale = HalfToFloat(s16);
          scales[(begin + b0) / block] = s16;
          for (int64_t i = b0; i < b0 + block; ++i) {
            const float v = scale > 0 ? std::nearbyint(x[i] / scale) : 0.0f;
            q[StoredAt(begin + i)] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
          }
        }
        return;
    }
  };
  // A 7B model is 6.7e9 conversions: large blocks over the cores (each row
  // depends on its own values only, so the split changes nothing).
  const int64_t threads = n * cols < (int64_t{1} << 20)
                              ? 1
                              : std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::min<int64_t>(n, 32));
  if (threads == 1) {
    set(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(set, std::min(n, t * per), std::min(n, (t + 1) * per));
  for (auto& t : pool) t.join();
}

int64_t ModelWeights::bytes() const {
  auto vec = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size() * 4); };
  int64_t total = embed.bytes() + lm_head.bytes() + vec(final_norm);
  for (const LayerWeights& l : layers) {
    total += l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes() + vec(l.input_norm) +
             vec(l.post_norm) + vec(l.qkv_bias) + vec(l.q_norm) + vec(l.k_norm);
  }
  return total;
}

void ModelWeights::Pack() {
  for (LayerWeights& l : layers) {
    for (WeightMatrix* m : {&l.qkv, &l.o, &l.gate_up, &l.down}) m->Pack();
  }
  lm_head.Pack();
}

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
                                         ShardSpec shard, WeightDType dtype) {
  ASSIGN_OR_RETURN(auto model, SafetensorsModel::Open(dir));
  SafetensorsSource source(std::move(model));
  return Build(config, shard, source, dtype);
}

absl::StatusOr<ModelWeights> DummyWeights(const ModelConfig& config, ShardSpec shard,
                                          uint64_t seed, WeightDType dtype) {
  DummySource source(seed, config.dtype);
  return Build(config, shard, source, dtype);
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
  // Matrices as fp32 (int8 dequantized), then encoded in `dtype`.
  add("model.embed_tokens.weight", {c.vocab_size, hidden}, w.embed.ToFloat().data());
  add("model.norm.weight", {hidden}, w.final_norm.data());
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, hidden}, w.lm_head.ToFloat().data());
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrFormat("model.layers.%d.", i);
    const LayerWeights& lw = w.layers[i];
    add(p + "input_layernorm.weight", {hidden}, lw.input_norm.data());
    add(p + "post_attention_layernorm.weight", {hidden}, lw.post_norm.data());
    const std::vector<float> qkv = lw.qkv.ToFloat();
    add(p + "self_attn.q_proj.weight", {q_rows, hidden}, qkv.data());
    add(p + "self_attn.k_proj.weight", {kv_rows, hidden}, qkv.data() + q_rows * hidden);
    add(p + "self_attn.v_proj.weight", {kv_rows, hidden}, qkv.data() + (q_rows + kv_rows) * hidden);
    if (c.attention_bias) {
      add(p + "self_attn.q_proj.bias", {q_rows}, lw.qkv_bias.data());
      add(p + "self_attn.k_proj.bias", {kv_rows}, lw.qkv_bias.data() + q_rows);
      add(p + "self_attn.v_proj.bias", {kv_rows}, lw.qkv_bias.data() + q_rows + kv_rows);
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {d}, lw.q_norm.data());
      add(p + "self_attn.k_norm.weight", {d}, lw.k_norm.data());
    }
    add(p + "self_attn.o_proj.weight", {hidden, q_rows}, lw.o.ToFloat().data());
    const std::vector<float> gate_up = lw.gate_up.ToFloat();
    add(p + "mlp.gate_proj.weight", {inter, hidden}, gate_up.data());
    add(p + "mlp.up_proj.weight", {inter, hidden}, gate_up.data() + inter * hidden);
    add(p + "mlp.down_proj.weight", {hidden, inter}, lw.down.ToFloat().data());
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
