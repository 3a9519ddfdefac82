// A Llama-family model's weights for one tensor-parallel rank on the host:
// matrices in fp32, fp16, bf16 or weight-only int8 (WeightDType), norms and
// biases in fp32; loaded from Hugging Face safetensors (fp32/fp16/bf16, one file or
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
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/model/model_config.h"
#include "kernels/api/dtype.h"
#include "kernels/cpu/attention.h"

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

// What the CPU model keeps its weight matrices in (--weight_dtype). kAuto is
// a request, never a matrix's dtype: each matrix in the dtype its checkpoint
// tensors have when they all have one 16-bit dtype, else fp32, so auto never
// rounds a weight (dummy weights: the config's torch_dtype).
enum class WeightDType : uint8_t { kAuto, kFloat32, kFloat16, kBFloat16, kInt8 };

// "auto" | "float32" | "float16" | "bfloat16" | "int8" (also "fp32", "fp16",
// "bf16"); INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<WeightDType> ParseWeightDType(std::string_view s);
const char* WeightDTypeName(WeightDType t);

// Weight-only int8: one fp16 scale per this many columns of a row (symmetric,
// scale = max |w| / 127 over the block, rounded up to a half: cpu::Int8Scale). Measured on the tiny reference
// models and a 156M Llama against per-row scales: see docs/models.md.
inline constexpr int64_t kInt8Block = 32;

// A row-major (rows, cols) matrix: a PyTorch Linear's weight (out_features,
// in_features), or an embedding (vocab, hidden). Exactly one storage vector
// is filled, by `dtype`.
struct WeightMatrix {
  WeightDType dtype = WeightDType::kFloat32;
  int64_t rows = 0, cols = 0;
  std::vector<float> f32;      // kFloat32
  std::vector<uint16_t> half;  // kFloat16 / kBFloat16: IEEE half or bfloat16 bits
  std::vector<int8_t> q;       // kInt8: w(r, c) = q(r, c) * scales[r * (cols / block) + c / block]
  std::vector<uint16_t> scales;  // kInt8: (rows, cols / block), IEEE half bits
  // kInt8: columns per scale: kInt8Block when it divides cols, else cols (one
  // scale per row).
  int64_t block = 0;
  // kInt8: q(r, c) stored at cpu::Int8InterleavedIndex(r, c, cols), the
  // decode kernel's layout (kernels/cpu/int8_layout.h), when
  // cpu::Int8Interleaves(rows, cols, block); else at r * cols + c. RowsToFloat
  // and SetRows take and give row-major column order either way.
  bool interleaved = false;
  // kFloat32, kFloat16, kBFloat16: rows in the decode kernel's packed layout
  // (kernels/cpu/packed_layout.h), set by Pack (the CPU model's own copy;
  // loaders write row-major). RowsToFloat and SetRows take and give
  // row-major rows either way.
  bool packed = false;

  // fp32 or 16-bit with cpu::Packs(rows, cols): stores the rows packed. Else
  // nothing changes. Returns whether it packed.
  bool Pack();

  // The CPU kernels' view of the storage (borrowed: valid while this lives
  // unchanged).
  cpu::WeightView View() const;

  // An empty matrix of `rows` x `cols` in `dtype` (not kAuto), zero-filled.
  static WeightMatrix Zeros(WeightDType dtype, int64_t rows, int64_t cols);

  bool empty() const { return rows * cols == 0; }
  int64_t num_elements() const { return rows * cols; }
  int64_t bytes() const;  // of the storage, scales included
  // Rows [r0, r0 + n) as fp32 into out (n, cols): int8 as q * scale.
  void RowsToFloat(int64_t r0, int64_t n, float* out) const;
  std::vector<float> ToFloat() const;
  // Rows [r0, r0 + n) from fp32 `src` (n, cols): rounded to nearest even in
  // 16 bits; int8 quantized per block.
  void SetRows(int64_t r0, int64_t n, const float* src);

 private:
  // kInt8: where value i = r * cols + c, w(r, c), is stored in q.
  int64_t StoredAt(int64_t i) const;
};

// One layer: matrices in the model's WeightDType, norms and biases in fp32.
struct LayerWeights {
  std::vector<float> input_norm;  // (hidden)
  WeightMatrix qkv;               // (q_local + 2 * kv_local, hidden): q rows, k rows, v rows
  std::vector<float> qkv_bias;    // (q_local + 2 * kv_local), empty without attention_bias
  std::vector<float> q_norm;      // (head_dim), empty without qk_norm
  std::vector<float> k_norm;      // (head_dim), empty without qk_norm
  WeightMatrix o;                 // (hidden, q_local): this rank's input columns
  std::vector<float> post_norm;   // (hidden)
  WeightMatrix gate_up;           // (2 * intermediate_local, hidden): gate rows, then up rows
  WeightMatrix down;              // (hidden, intermediate_local)
};

struct ModelWeights {
  ShardLayout layout;
  WeightMatrix embed;             // (vocab, hidden)
  std::vector<float> final_norm;  // (hidden)
  WeightMatrix lm_head;           // (vocab, hidden); empty when tied to embed
  std::vector<LayerWeights> layers;

  const WeightMatrix& output_embedding() const {
    return lm_head.empty() ? embed : lm_head;
  }
  // Bytes of every matrix, vector and scale held.
  int64_t bytes() const;
  // Every Linear matrix (each layer's qkv, o, gate_up, down and the LM head)
  // in the CPU decode kernel's packed layout where it packs (WeightMatrix::Pack).
  void Pack();
};

// Loads `dir` (model.safetensors or model.safetensors.index.json + shards).
// Every tensor's presence, shape and dtype is checked; errors name the file
// and the tensor.
// Matrices (embedding, LM head, projections) are stored in `dtype` as they
// are read, a block of rows at a time: no fp32 copy of the model is made on
// the way. Norms and biases are fp32 whatever `dtype` is.
absl::StatusOr<ModelWeights> LoadWeights(const std::string& dir, const ModelConfig& config,
                                         ShardSpec shard, WeightDType dtype = WeightDType::kFloat32);

// Seeded random weights: every element is a hash of (seed, tensor name,
// element index), so any shard equals the same slice of the whole model.
// Linear weights have std 1/sqrt(fan_in), embeddings std 1, norms 1; the
// matrices rounded to `dtype` (auto: the config's torch_dtype).
absl::StatusOr<ModelWeights> DummyWeights(const ModelConfig& config, ShardSpec shard,
                                          uint64_t seed, WeightDType dtype = WeightDType::kFloat32);

// Writes config.json and the weights of an unsharded model (world_size 1) as
// Hugging Face names them, in `dtype`: model.safetensors, or shards of at most
// `max_shard_bytes` with model.safetensors.index.json when that is > 0.
absl::Status SaveModel(const std::string& dir, const ModelConfig& config,
                       const ModelWeights& weights, DType dtype, int64_t max_shard_bytes = 0);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_WEIGHTS_H_
