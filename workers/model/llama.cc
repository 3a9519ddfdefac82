#include "workers/model/llama.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "workers/collectives/communicator.h"

// OpenBLAS's own (cblas.h is an alternatives link that may not declare it).
extern "C" void openblas_set_num_threads(int num_threads);

namespace chunkattn {
namespace {

// Most decode rows the matrix-vector kernel takes; more go to sgemm with the
// prefill rows. Decode tokens/s on the 2-core VM (a 156M-parameter Llama in
// F32, hidden 1024, 8 layers, 2 threads; 16-token prompts, 64 new tokens),
// kernel over sgemm: 1 row 2.56x, 8 rows 2.03x, 16 rows 1.30x, 32 rows
// 0.96x, 64 rows 0.81x. For 16-bit and int8 weights sgemm must first convert
// each block of weight rows to fp32, and the kernel reads them as stored (int8
// in integers): decode step time with 64 here over 24, same model, paired
// medians: int8 32 rows 1.64x faster, 64 rows 1.14x; F16 32 rows 1.43x, 64
// rows 1.04x. The AVX-512 kernels take fp32 as far (the 156M model's
// matrices, 2 threads: 40 ms at 32 rows and 59 at 64, sgemm 49 and 81).
int64_t VectorRows(WeightDType dtype, cpu::Isa isa) {
  const bool fp32 = dtype == WeightDType::kFloat32 || dtype == WeightDType::kAuto;
  return fp32 && isa != cpu::Isa::kAvx512 ? 24 : 64;
}

// Weight rows converted to fp32 per sgemm when the weights are 16-bit or
// int8 (prefill): a block of about this many values (4 MiB of fp32). sgemm
// repacks the activations for every block, so small blocks cost: prefill of
// 16 x 128 tokens of a 156M Llama on the 2-core VM, F16 weights against F32,
// took 1.32x the time with 1 MiB blocks, 1.07x with 4 MiB (int8: 1.38x,
// 1.14x); 16 MiB was no better.
constexpr int64_t kConvertFloats = int64_t{1} << 20;

// c (m, n), row stride ldc = a (m, k) * w^T, with w (n, k) row-major.
void Sgemm(const float* a, int64_t m, int64_t k, const float* w, int64_t n, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), w, static_cast<int>(k), 0.0f, c,
              static_cast<int>(ldc));
}

// out (rows, n) = x / rms(x) * weight, per row, as Hugging Face's LlamaRMSNorm.
// `out` may be `x` (each element is read before its own write).
void RmsNorm(const float* x, int64_t rows, int64_t n, const float* weight, double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
    float* o = out + r * n;
    for (int64_t i = 0; i < n; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

void RmsNorm(const float* x, int64_t rows, int64_t n, const std::vector<float>& weight, double eps,
             std::vector<float>& out) {
  out.resize(static_cast<size_t>(rows * n));
  RmsNorm(x, rows, n, weight.data(), eps, out.data());
}

// Rotates each head of `x` (rows, heads, d) by its row's angles, in the
// "rotate_half" convention of Hugging Face Llama: dimension i pairs with
// i + d/2.
void ApplyRope(float* x, int64_t rows, int heads, int d, const std::vector<float>& cos,
               const std::vector<float>& sin) {
  const int half = d / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos.data() + r * half;
    const float* s = sin.data() + r * half;
    for (int h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * d;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    // Transformers computes the base frequencies in fp32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    inv[i] = 1.0f / static_cast<float>(std::pow(c.rope_theta, static_cast<double>(exponent)));
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.kind == RopeScalingKind::kLinear) {
    for (float& f : inv) f = static_cast<float>(f / rs.factor);
  } else if (rs.kind == RopeScalingKind::kLlama3) {
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen < high_wavelen) continue;  // high frequencies stay
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rs.factor);
      } else {
        const double smooth = (old_ctx / wavelen - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / rs.factor + smooth * f);
      }
    }
  }
  return inv;
}

LlamaModel::LlamaModel(const ModelConfig& config, ModelWeights weights,
                       const ModelOptions& options, Communicator* comm, ThreadPool* pool)
    : config_(config),
      weights_(std::move(weights)),
      options_(options),
      comm_(comm),
      pool_(pool),
      attention_(pool, options.cpu_isa),
      inv_freq_(RopeInverseFrequencies(config)) {}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelConfig& config,
                                                               ModelWeights weights,
                                                               const ModelOptions& options,
                                                               Communicator* comm,
                                                               ThreadPool* pool) {
  if (config.head_dim % 16 != 0 || config.head_dim > kMaxHeadDim) {
    return absl::UnimplementedError(absl::StrFormat(
        "head_dim %d: the attention kernels need a multiple of 16 up to %d", config.head_dim,
        kMaxHeadDim));
  }
  const ShardLayout& l = weights.layout;
  RETURN_IF_ERROR(CheckShardMatchesGroup(l, comm == nullptr ? 0 : comm->rank(),
                                         comm == nullptr ? 1 : comm->world_size()));
  // OpenBLAS starts a thread per core of the machine; the GEMMs get the
  // threads the attention gets (--threads, else the affinity and cgroup
  // limit), so a container with 2 CPUs does not run 64 BLAS threads.
  openblas_set_num_threads(pool != nullptr ? pool->num_threads() : 1);
  const int64_t hidden = config.hidden_size, d = config.head_dim;
  const int64_t width = int64_t{l.num_heads + 2 * l.num_kv_heads} * d;
  auto shaped = [](const WeightMatrix& m, int64_t rows, int64_t cols) {
    return m.rows == rows && m.cols == cols && m.bytes() > 0;
  };
  bool match = static_cast<int>(weights.layers.size()) == config.num_layers &&
               shaped(weights.embed, config.vocab_size, hidden) &&
               shaped(weights.output_embedding(), config.vocab_size, hidden);
  for (size_t i = 0; match && i < weights.layers.size(); ++i) {
    const LayerWeights& w = weights.layers[i];
    match = shaped(w.qkv, width, hidden) && shaped(w.o, hidden, int64_t{l.num_heads} * d) &&
            shaped(w.gate_up, 2 * int64_t{l.intermediate}, hidden) && shaped(w.down, hidden, l.intermediate);
  }
  if (!match) return absl::InvalidArgumentError("weights do not match the config");
  // Forward applies q/k norms exactly when a layer has them: every layer
  // must have them when the config says so, and none otherwise.
  const size_t qk_norm_size = config.qk_norm ? static_cast<size_t>(d) : 0;
  for (const LayerWeights& w : weights.layers) {
    if (w.q_norm.size() != qk_norm_size || w.k_norm.size() != qk_norm_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "weights do not match the config: q_norm/k_norm must have %d values", qk_norm_size));
    }
  }
  ASSIGN_OR_RETURN(auto kv, KvPool::Create(KvShapeOf(config, l, options), options.num_kv_chunks));
  // fp32 and 16-bit matrices in the decode kernel's packed layout
  // (kernels/cpu/packed_layout.h): decode streams each group of 4 rows as one
  // read (one core: fp32 1.2x, fp16 1.5x), with the same sums bit for bit;
  // prefill converts blocks for sgemm, as it does int8 weights.
  weights.Pack();
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, std::move(weights), options, comm, pool));
  model->kv_ = std::move(kv);
  return model;
}

// c (m, n) = a (m, k) * w^T, with w (n, k) row-major: a PyTorch Linear.
// The first `matrix_rows` rows (prefill: many per sequence) through BLAS's
// sgemm; the rest (decode: one per sequence), up to VectorRows of them,
// through the matrix-vector kernel, which reads the weights once where
// OpenBLAS's sgemm first packs the whole matrix (2.9 ms for one row where a
// pass over it takes 0.24 ms on the 2-core VM), and reads 16-bit and int8
// weights as they are stored. A decode row's result then depends on the row
// alone, not on its batch (cpu::LinearRows).
absl::Status LlamaModel::Linear(const float* a, int64_t m, int64_t matrix_rows, int64_t k, const WeightMatrix& w,
                                int64_t n, std::vector<float>& c) {
  c.resize(static_cast<size_t>(m * n));
  const int64_t vector_rows = m - matrix_rows;
  const bool vector = vector_rows > 0 && vector_rows <= VectorRows(w.dtype, attention_.isa()) && k % 8 == 0;
  const int64_t sgemm_rows = vector ? matrix_rows : m;
  if (sgemm_rows > 0) RETURN_IF_ERROR(MatrixRows(a, sgemm_rows, k, w, n, c.data()));
  if (!vector) return absl::OkStatus();
  return cpu::LinearRows(a + matrix_rows * k, vector_rows, k, w.View(), n, c.data() + matrix_rows * n, pool_,
                         attention_.isa());
}

// sgemm over fp32 weights as they are; over 16-bit or int8 weights a block of
// weight rows at a time, converted to fp32 first (kConvertFloats), so no fp32
// copy of the model is ever held.
absl::Status LlamaModel::MatrixRows(const float* a, int64_t m, int64_t k, const WeightMatrix& w, int64_t n,
                                    float* c) {
  if (w.dtype == WeightDType::kFloat32 && !w.packed) {
    Sgemm(a, m, k, w.f32.data(), n, c, n);
    return absl::OkStatus();
  }
  const int64_t block = std::min(n, std::max<int64_t>(16, kConvertFloats / k));
  converted_.resize(static_cast<size_t>(block * k));
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t jn = std::min(block, n - j0);
    RETURN_IF_ERROR(cpu::WeightRowsToFloat(w.View(), k, j0, j0 + jn, converted_.data(), pool_, attention_.isa()));
    Sgemm(a, m, k, converted_.data(), jn, c + j0, n);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::AllReduce(std::vector<float>& x) {
  if (comm_ == nullptr || comm_->world_size() == 1) return absl::OkStatus();
  return comm_->AllReduceSum(x.data(), static_cast<int64_t>(x.size()));
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, std::vector<float>& logits) {
  RETURN_IF_ERROR(step_.Plan(batch, config_, options_.chunk_size, kv_->num_chunks()));
  RETURN_IF_ERROR(kv_->Copy(batch.copies));
  const std::vector<int32_t>& positions = step_.positions();

  const ShardLayout& l = weights_.layout;
  const int64_t rows = static_cast<int64_t>(batch.tokens.size());
  const int64_t hidden = config_.hidden_size;
  const int d = config_.head_dim, half = d / 2;
  const int64_t q_width = int64_t{l.num_heads} * d, kv_width = int64_t{l.num_kv_heads} * d;
  const int64_t qkv_width = q_width + 2 * kv_width;
  const int64_t inter = l.intermediate;
  const int64_t prefill_rows = batch.prefill.num_seqs() > 0 ? batch.prefill.num_tokens() : 0;

  x_.resize(static_cast<size_t>(rows * hidden));
  const cpu::WeightView embed = weights_.embed.View();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = batch.tokens[r];
    RETURN_IF_ERROR(cpu::WeightRowsToFloat(embed, hidden, token, token + 1, x_.data() + r * hidden, nullptr,
                                           attention_.isa()));
  }
  cos_.resize(static_cast<size_t>(rows * half));
  sin_.resize(static_cast<size_t>(rows * half));
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < half; ++i) {
      // The angle is an fp32 product, as in transformers; its cos/sin exact.
      const float angle = static_cast<float>(positions[r]) * inv_freq_[i];
      cos_[r * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_[r * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  AttentionShape shape;
  shape.num_heads = l.num_heads;
  shape.num_kv_heads = l.num_kv_heads;
  shape.head_dim = d;
  q_.resize(static_cast<size_t>(rows * q_width));
  k_.resize(static_cast<size_t>(rows * kv_width));
  v_.resize(static_cast<size_t>(rows * kv_width));
  attn_.resize(static_cast<size_t>(rows * q_width));
  act_.resize(static_cast<size_t>(rows * inter));

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    const LayerWeights& w = weights_.layers[layer];
    RmsNorm(x_.data(), rows, hidden, w.input_norm, config_.rms_norm_eps, h_);
    RETURN_IF_ERROR(Linear(h_.data(), rows, prefill_rows, hidden, w.qkv, qkv_width, qkv_));
    for (int64_t r = 0; r < rows; ++r) {
      float* row = qkv_.data() + r * qkv_width;
      if (!w.qkv_bias.empty()) {
        for (int64_t i = 0; i < qkv_width; ++i) row[i] += w.qkv_bias[i];
      }
      std::copy_n(row, q_width, q_.data() + r * q_width);
      std::copy_n(row + q_width, kv_width, k_.data() + r * kv_width);
      std::copy_n(row + q_width + kv_width, kv_width, v_.data() + r * kv_width);
    }
    if (config_.qk_norm) {  // Qwen3: each head's (d) vector, after the bias, before RoPE
      RmsNorm(q_.data(), rows * l.num_heads, d, w.q_norm.data(), config_.rms_norm_eps, q_.data());
      RmsNorm(k_.data(), rows * l.num_kv_heads, d, w.k_norm.data(), config_.rms_norm_eps, k_.data());
    }
    ApplyRope(q_.data(), rows, l.num_heads, d, cos_, sin_);
    ApplyRope(k_.data(), rows, l.num_kv_heads, d, cos_, sin_);
    const KvPoolView view = kv_->Layer(layer);
    RETURN_IF_ERROR(cpu::AppendKv(view, k_.data(), v_.data(), step_.slots()));
    if (prefill_rows > 0) {
      RETURN_IF_ERROR(attention_.Prefill(batch.prefill, view, shape, q_.data(), attn_.data()));
    }
    if (batch.decode != nullptr) {
      RETURN_IF_ERROR(attention_.Decode(options_.decode_impl, step_.decode_plan(), *batch.decode, view, shape,
                                        q_.data() + prefill_rows * q_width,
                                        attn_.data() + prefill_rows * q_width));
    }
    RETURN_IF_ERROR(Linear(attn_.data(), rows, prefill_rows, q_width, w.o, hidden, out_));
    RETURN_IF_ERROR(AllReduce(out_));
    for (int64_t i = 0; i < rows * hidden; ++i) x_[i] += out_[i];

    RmsNorm(x_.data(), rows, hidden, w.post_norm, config_.rms_norm_eps, h_);
    RETURN_IF_ERROR(Linear(h_.data(), rows, prefill_rows, hidden, w.gate_up, 2 * inter, gate_up_));
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = gate_up_.data() + r * 2 * inter;
      const float* u = g + inter;
      float* a = act_.data() + r * inter;
      for (int64_t i = 0; i < inter; ++i) a[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
    RETURN_IF_ERROR(Linear(act_.data(), rows, prefill_rows, inter, w.down, hidden, out_));
    RETURN_IF_ERROR(AllReduce(out_));
    for (int64_t i = 0; i < rows * hidden; ++i) x_[i] += out_[i];
  }

  const int64_t num_out = static_cast<int64_t>(batch.logits_rows.size());
  if (num_out == 0) {
    logits.clear();
    return absl::OkStatus();
  }
  rows_.resize(static_cast<size_t>(num_out * hidden));
  for (int64_t i = 0; i < num_out; ++i) {
    std::copy_n(x_.data() + int64_t{batch.logits_rows[i]} * hidden, hidden,
                rows_.data() + i * hidden);
  }
  RmsNorm(rows_.data(), num_out, hidden, weights_.final_norm, config_.rms_norm_eps, h_);
  // Every logits row is one per sequence: all through the vector kernel when few.
  return Linear(h_.data(), num_out, 0, hidden, weights_.output_embedding(), config_.vocab_size, logits);
}

}  // namespace chunkattn
