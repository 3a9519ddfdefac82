// The layer primitives of layers.h against plain float64 references written
// here, on randomized inputs (fixed seeds), fp16 and bf16 (the q/k norm in
// fp32). Outputs are
// poisoned (all-ones bytes: NaN in every type) before each launch, so an
// element never written fails its comparison, and the KV pool's slots that
// must stay untouched are checked bit for bit.
//
// Tolerances: the references read the same stored (rounded) inputs, so what
// remains is fp32 arithmetic (~1e-7 relative) and the output's own rounding
// (half an ulp: 2^-11 fp16, 2^-8 bf16), allowed four times over: relative
// 2e-3 (fp16) and 1.6e-2 (bf16), plus 1e-5 absolute for results near zero
// (cancellation in the rotation, fp16 subnormals). Greedy log-probs: 1e-4.
//
// The GPU tests skip, with a message, where no GPU is visible; the argument
// checks run before any CUDA call, so LayersContract runs everywhere.
#include "kernels/cuda/layers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/str_format.h"
#include "kernels/api/attention.h"
#include "kernels/cuda/cuda_attention.h"  // DeviceBuffer
#include "kernels/cuda/device.h"
#include "kernels/cuda/tests/cuda_test_util.h"

namespace chunkattn::cuda {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine: the layer kernels were not run"

constexpr DType kStorageTypes[] = {DType::kFloat16, DType::kBFloat16};
constexpr double kAbsTol = 1e-5;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

double RelTol(DType t) { return t == DType::kFloat16 ? 2e-3 : 1.6e-2; }

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

DeviceBuffer Alloc(size_t bytes) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) {
    ADD_FAILURE() << b.status();
    return DeviceBuffer();
  }
  return std::move(*b);
}

// `bytes` of 0xff: NaN as fp32, fp16 and bf16.
DeviceBuffer Poisoned(size_t bytes) {
  DeviceBuffer b = Alloc(bytes);
  EXPECT_EQ(cudaMemset(b.get(), 0xff, bytes), cudaSuccess);
  return b;
}

template <typename V>
DeviceBuffer Upload(const std::vector<V>& host) {
  DeviceBuffer b = Alloc(host.size() * sizeof(V));
  EXPECT_EQ(cudaMemcpy(b.get(), host.data(), host.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

template <typename V>
std::vector<V> Download(const DeviceBuffer& b, size_t n) {
  std::vector<V> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), b.get(), n * sizeof(V), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

std::vector<float> Normal(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

using testing::Round;
using testing::Rounded;

std::vector<float> Values(DType t, const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = LoadAs(t, bits.data(), static_cast<int64_t>(i));
  return v;
}

// Fails for each element with |got - want| > rel * |want| + abs (NaN fails),
// naming the first few.
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double rel, double abs) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= rel * std::fabs(want[i]) + abs) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance";
}

void ExpectBitEqual(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (Bits(got[i]) != Bits(want[i]) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << "elements differ";
}

// ---------------------------------------------------------------------------
// Argument checks (no GPU needed).

TEST(LayersContract, RejectsBadArgumentsBeforeAnyCudaCall) {
  // Host memory stands in for device pointers: nothing is dereferenced.
  alignas(16) static float f[64];
  alignas(16) static int32_t i32[8];
  alignas(16) static int64_t i64[8];
  void* const p = f;
  void* const misaligned = reinterpret_cast<char*>(f) + 2;
  const cudaError_t kBad = cudaErrorInvalidValue;

  EXPECT_EQ(LaunchEmbed(DType::kFloat32, p, i32, 1, 64, f, nullptr), kBad);
  EXPECT_EQ(LaunchEmbed(DType::kFloat16, p, i32, 1, 60, f, nullptr), kBad);
  EXPECT_EQ(LaunchEmbed(DType::kFloat16, p, i32, -1, 64, f, nullptr), kBad);
  EXPECT_EQ(LaunchEmbed(DType::kFloat16, misaligned, i32, 1, 64, f, nullptr), kBad);
  EXPECT_EQ(LaunchEmbed(DType::kBFloat16, p, nullptr, 1, 64, f, nullptr), kBad);

  EXPECT_EQ(LaunchAddRmsNorm(DType::kFloat32, f, nullptr, nullptr, f, 1, 64, 1e-5f, p, nullptr), kBad);
  EXPECT_EQ(LaunchAddRmsNorm(DType::kFloat16, f, nullptr, nullptr, f, 1, 12, 1e-5f, p, nullptr), kBad);
  EXPECT_EQ(LaunchAddRmsNorm(DType::kFloat16, f, nullptr, nullptr, f, 1, kMaxNormHidden + 8, 1e-5f, p, nullptr), kBad);
  EXPECT_EQ(LaunchAddRmsNorm(DType::kBFloat16, f, nullptr, nullptr, f, 1, 64, 1e-5f, misaligned, nullptr), kBad);
  EXPECT_EQ(LaunchAddRmsNorm(DType::kBFloat16, f, nullptr, nullptr, nullptr, 1, 64, 1e-5f, p, nullptr), kBad);

  KvPoolView kv;
  kv.k = p;
  kv.v = p;
  kv.dtype = DType::kFloat16;
  kv.num_chunks = 1;
  kv.num_kv_heads = 2;
  kv.chunk_size = 16;
  kv.head_dim = 64;
  auto rope = [&](DType dtype, int num_kv_heads, int head_dim, const KvPoolView& view) {
    return LaunchRopeAppend(dtype, f, nullptr, f, f, i32, i64, 1, 8, num_kv_heads, head_dim, view, p, nullptr);
  };
  KvPoolView fp32_kv = kv;
  fp32_kv.dtype = DType::kFloat32;
  EXPECT_EQ(rope(DType::kFloat32, 2, 64, fp32_kv), kBad);
  EXPECT_EQ(rope(DType::kBFloat16, 2, 64, kv), kBad);  // the pool is fp16
  EXPECT_EQ(rope(DType::kFloat16, 4, 64, kv), kBad);   // the pool has 2 KV heads
  EXPECT_EQ(rope(DType::kFloat16, 2, 128, kv), kBad);  // ... and head dim 64
  KvPoolView odd = kv;
  odd.head_dim = 63;
  EXPECT_EQ(rope(DType::kFloat16, 2, 63, odd), kBad);
  KvPoolView wide = kv;
  wide.head_dim = 258;
  EXPECT_EQ(rope(DType::kFloat16, 2, 258, wide), kBad);
  KvPoolView not_pow2 = kv;
  not_pow2.chunk_size = 48;
  EXPECT_EQ(rope(DType::kFloat16, 2, 64, not_pow2), kBad);
  KvPoolView no_v = kv;
  no_v.v = nullptr;
  EXPECT_EQ(rope(DType::kFloat16, 2, 64, no_v), kBad);
  EXPECT_EQ(LaunchRopeAppend(DType::kFloat16, f, nullptr, f, f, i32, i64, 1, 0, 2, 64, kv, p, nullptr), kBad);

  EXPECT_EQ(LaunchQkNorm(f, nullptr, f, f, -1, 8, 2, 64, 1e-6f, nullptr), kBad);
  EXPECT_EQ(LaunchQkNorm(f, nullptr, f, f, 1, 0, 2, 64, 1e-6f, nullptr), kBad);
  EXPECT_EQ(LaunchQkNorm(f, nullptr, f, f, 1, 8, 0, 64, 1e-6f, nullptr), kBad);
  EXPECT_EQ(LaunchQkNorm(f, nullptr, f, f, 1, 8, 2, 0, 1e-6f, nullptr), kBad);
  EXPECT_EQ(LaunchQkNorm(f, nullptr, f, f, 1, 8, 2, 258, 1e-6f, nullptr), kBad);
  EXPECT_EQ(LaunchQkNorm(nullptr, nullptr, f, f, 1, 8, 2, 64, 1e-6f, nullptr), kBad);
  EXPECT_EQ(LaunchQkNorm(f, nullptr, nullptr, f, 1, 8, 2, 64, 1e-6f, nullptr), kBad);
  EXPECT_EQ(LaunchQkNorm(f, nullptr, f, nullptr, 1, 8, 2, 64, 1e-6f, nullptr), kBad);

  EXPECT_EQ(LaunchSwiGlu(DType::kFloat32, p, 1, 64, p, nullptr), kBad);
  EXPECT_EQ(LaunchSwiGlu(DType::kFloat16, p, 1, 0, p, nullptr), kBad);
  EXPECT_EQ(LaunchSwiGlu(DType::kFloat16, p, -1, 64, p, nullptr), kBad);
  EXPECT_EQ(LaunchSwiGlu(DType::kBFloat16, nullptr, 1, 64, p, nullptr), kBad);

  EXPECT_EQ(LaunchGreedy(f, 1, 0, i32, f, nullptr), kBad);
  EXPECT_EQ(LaunchGreedy(f, -1, 10, i32, f, nullptr), kBad);
  EXPECT_EQ(LaunchGreedy(f, 1, 10, nullptr, f, nullptr), kBad);

  const SampleRowParams* sp = reinterpret_cast<const SampleRowParams*>(p);
  EXPECT_EQ(LaunchSample(f, 1, 0, 0, sp, 1, nullptr, nullptr, i32, f, nullptr), kBad);
  EXPECT_EQ(LaunchSample(f, 1, kMaxSampleVocab + 1, 0, sp, 1, nullptr, nullptr, i32, f, nullptr), kBad);
  EXPECT_EQ(LaunchSample(f, 1, kMaxPenaltyVocab + 1, 0, sp, 1, i32, nullptr, i32, f, nullptr), kBad);
  EXPECT_EQ(LaunchSample(f, -1, 10, 0, sp, 1, nullptr, nullptr, i32, f, nullptr), kBad);
  EXPECT_EQ(LaunchSample(f, 1, 10, 0, sp, -1, nullptr, nullptr, i32, f, nullptr), kBad);
  EXPECT_EQ(LaunchSample(f, 1, 10, 0, nullptr, 1, nullptr, nullptr, i32, f, nullptr), kBad);
  EXPECT_EQ(LaunchSample(f, 1, 10, 0, sp, 1, nullptr, nullptr, i32, nullptr, nullptr), kBad);
}

TEST(LayersContract, ZeroRowsIsANoOp) {
  KvPoolView kv;
  kv.dtype = DType::kBFloat16;
  kv.num_kv_heads = 2;
  kv.chunk_size = 64;
  kv.head_dim = 128;
  for (DType dtype : kStorageTypes) {
    kv.dtype = dtype;
    EXPECT_EQ(LaunchEmbed(dtype, nullptr, nullptr, 0, 64, nullptr, nullptr), cudaSuccess);
    EXPECT_EQ(LaunchAddRmsNorm(dtype, nullptr, nullptr, nullptr, nullptr, 0, 64, 1e-5f, nullptr, nullptr), cudaSuccess);
    EXPECT_EQ(LaunchRopeAppend(dtype, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, 2, 128, kv, nullptr,
                               nullptr),
              cudaSuccess);
    EXPECT_EQ(LaunchSwiGlu(dtype, nullptr, 0, 64, nullptr, nullptr), cudaSuccess);
  }
  EXPECT_EQ(LaunchQkNorm(nullptr, nullptr, nullptr, nullptr, 0, 8, 2, 128, 1e-6f, nullptr), cudaSuccess);
  EXPECT_EQ(LaunchGreedy(nullptr, 0, 32000, nullptr, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(LaunchSample(nullptr, 0, 32000, 0, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr), cudaSuccess);
}

// ---------------------------------------------------------------------------
// Embedding.

TEST(LayersEmbed, CopiesTableRowsExactly) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  const int vocab = 50, rows = 37;
  for (DType dtype : kStorageTypes) {
    for (int hidden : {64, 192, 4096}) {  // fewer vectors than threads, a partial warp, several per thread
      SCOPED_TRACE(absl::StrFormat("%s, hidden %d", DTypeName(dtype), hidden));
      const Rounded table = Round(dtype, Normal(rng, int64_t{vocab} * hidden, 1.0f));
      std::vector<int32_t> tokens(rows);
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      for (int32_t& t : tokens) t = pick(rng);
      tokens[0] = 0;
      tokens[1] = vocab - 1;
      tokens[2] = tokens[3];  // a repeat
      DeviceBuffer d_table = Upload(table.bits), d_tokens = Upload(tokens);
      DeviceBuffer d_x = Poisoned(int64_t{rows} * hidden * 4);
      ASSERT_EQ(LaunchEmbed(dtype, d_table.get(), static_cast<const int32_t*>(d_tokens.get()), rows, hidden,
                            static_cast<float*>(d_x.get()), nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> want(int64_t{rows} * hidden);
      for (int r = 0; r < rows; ++r) {
        std::copy_n(table.values.begin() + int64_t{tokens[r]} * hidden, hidden, want.begin() + int64_t{r} * hidden);
      }
      ExpectBitEqual(Download<float>(d_x, want.size()), want);
    }
  }
}

// ---------------------------------------------------------------------------
// Residual add + RMSNorm.

TEST(LayersAddRmsNorm, MatchesFloat64) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  const float eps = 1e-5f;
  const int stream_rows = 9;
  const std::vector<int32_t> gather = {3, 0, 3, 8, 8, 1, 5};  // repeats, out of order
  // 64: 16 float4s on one warp; 576: 5 warps; 4096: 4 per thread of 256;
  // 4160: 512 threads, some idle in the last round; 16384: the largest.
  for (int hidden : {64, 576, 4096, 4160, kMaxNormHidden}) {
    for (DType dtype : kStorageTypes) {
      for (const bool with_delta : {false, true}) {
        for (const bool with_gather : {false, true}) {
          SCOPED_TRACE(absl::StrFormat("%s, hidden %d, delta %d, gather %d", DTypeName(dtype), hidden,
                                       static_cast<int>(with_delta), static_cast<int>(with_gather)));
          std::vector<float> x = Normal(rng, int64_t{stream_rows} * hidden, 1.0f);
          for (int r = 0; r < stream_rows; ++r) {  // rows of very different norms
            const float scale = r % 3 == 0 ? 0.01f : (r % 3 == 1 ? 1.0f : 30.0f);
            for (int k = 0; k < hidden; ++k) x[int64_t{r} * hidden + k] *= scale;
          }
          const std::vector<float> delta = Normal(rng, x.size(), 0.5f);
          std::vector<float> weight = Normal(rng, hidden, 0.1f);
          for (float& w : weight) w += 1.0f;

          // The residual stream after the add (an fp32 add, as the kernel does).
          std::vector<float> y = x;
          if (with_delta) {
            for (size_t k = 0; k < y.size(); ++k) y[k] = x[k] + delta[k];
          }
          const int out_rows = with_gather ? static_cast<int>(gather.size()) : stream_rows;
          std::vector<double> want(int64_t{out_rows} * hidden);
          for (int i = 0; i < out_rows; ++i) {
            const int r = with_gather ? gather[i] : i;
            const float* yr = y.data() + int64_t{r} * hidden;
            double ss = 0;
            for (int k = 0; k < hidden; ++k) ss += double{yr[k]} * yr[k];
            const double inv = 1.0 / std::sqrt(ss / hidden + eps);
            for (int k = 0; k < hidden; ++k) want[int64_t{i} * hidden + k] = double{weight[k]} * yr[k] * inv;
          }

          DeviceBuffer d_x = Upload(x), d_delta = Upload(delta), d_weight = Upload(weight), d_gather = Upload(gather);
          DeviceBuffer d_out = Poisoned(int64_t{out_rows} * hidden * 2);
          ASSERT_EQ(
              LaunchAddRmsNorm(dtype, static_cast<float*>(d_x.get()),
                               with_delta ? static_cast<const float*>(d_delta.get()) : nullptr,
                               with_gather ? static_cast<const int32_t*>(d_gather.get()) : nullptr,
                               static_cast<const float*>(d_weight.get()), out_rows, hidden, eps, d_out.get(), nullptr),
              cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ExpectNear(Values(dtype, Download<uint16_t>(d_out, want.size())), want, RelTol(dtype), kAbsTol);
          // x moves on only for a plain residual add; with gather it is read-only.
          ExpectBitEqual(Download<float>(d_x, x.size()), with_delta && !with_gather ? y : x);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// RoPE + KV append.

std::vector<float> InvFreq(int head_dim) {
  std::vector<float> inv(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / static_cast<float>(std::pow(10000.0, static_cast<double>(exponent)));
  }
  return inv;
}

using RopeParams = std::tuple<DType, int, int, bool>;  // (dtype, head_dim, chunk_size, bias)
class LayersRopeAppend : public ::testing::TestWithParam<RopeParams> {};

TEST_P(LayersRopeAppend, QAndPoolMatchFloat64) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, d, c, with_bias] = GetParam();
  const int num_heads = 8, num_kv_heads = 2, half = d / 2, heads = num_heads + 2 * num_kv_heads;
  const int rows = 13, max_positions = 300;
  const int64_t num_chunks = 4;  // 64 or 256 slots for 13 rows
  const int width = heads * d;
  std::mt19937 rng(100 * d + c + (with_bias ? 7 : 0) + static_cast<int>(dtype));

  const std::vector<float> qkv = Normal(rng, int64_t{rows} * width, 2.0f);
  const std::vector<float> bias = with_bias ? Normal(rng, width, 0.5f) : std::vector<float>();
  const std::vector<float> inv_freq = InvFreq(d);
  std::vector<float> cos_table(int64_t{max_positions} * half), sin_table(cos_table.size());
  FillRopeTables(inv_freq.data(), half, max_positions, cos_table.data(), sin_table.data());
  std::vector<int32_t> positions(rows);
  std::uniform_int_distribution<int32_t> pick_pos(0, max_positions - 1);
  for (int32_t& p : positions) p = pick_pos(rng);
  positions[0] = 0;
  positions[1] = max_positions - 1;
  // Distinct slots anywhere in the pool; rows 3 and 9 are padding.
  std::vector<int64_t> all_slots(num_chunks * c);
  std::iota(all_slots.begin(), all_slots.end(), int64_t{0});
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + rows);
  slots[3] = -1;
  slots[9] = -1;

  // Expected q, and the pool with NaN where nothing may be written.
  const size_t pool_elems = static_cast<size_t>(num_chunks) * num_kv_heads * c * d;
  std::vector<double> want_q(int64_t{rows} * num_heads * d);
  std::vector<double> want_k(pool_elems, std::nan("")), want_v(pool_elems, std::nan(""));
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      std::vector<double> v(d);
      for (int i = 0; i < d; ++i) {
        const int col = h * d + i;
        v[i] = double{qkv[int64_t{r} * width + col]} + (with_bias ? double{bias[col]} : 0.0);
      }
      if (h < num_heads + num_kv_heads) {
        const float* cr = cos_table.data() + int64_t{positions[r]} * half;
        const float* sr = sin_table.data() + int64_t{positions[r]} * half;
        for (int i = 0; i < half; ++i) {
          const double a = v[i], b = v[i + half];
          v[i] = a * cr[i] - b * sr[i];
          v[i + half] = b * cr[i] + a * sr[i];
        }
      }
      if (h < num_heads) {
        std::copy(v.begin(), v.end(), want_q.begin() + (int64_t{r} * num_heads + h) * d);
      } else if (slots[r] >= 0) {
        const bool is_k = h < num_heads + num_kv_heads;
        const int kv_head = is_k ? h - num_heads : h - num_heads - num_kv_heads;
        const int64_t at = ((slots[r] / c * num_kv_heads + kv_head) * c + slots[r] % c) * d;
        std::copy(v.begin(), v.end(), (is_k ? want_k : want_v).begin() + at);
      }
    }
  }

  DeviceBuffer d_qkv = Upload(qkv), d_cos = Upload(cos_table), d_sin = Upload(sin_table);
  DeviceBuffer d_bias = with_bias ? Upload(bias) : DeviceBuffer();
  DeviceBuffer d_positions = Upload(positions), d_slots = Upload(slots);
  DeviceBuffer d_k = Poisoned(pool_elems * 2), d_v = Poisoned(pool_elems * 2);
  DeviceBuffer d_q = Poisoned(want_q.size() * 2);
  KvPoolView kv;
  kv.k = d_k.get();
  kv.v = d_v.get();
  kv.dtype = dtype;
  kv.num_chunks = num_chunks;
  kv.num_kv_heads = num_kv_heads;
  kv.chunk_size = c;
  kv.head_dim = d;
  ASSERT_EQ(LaunchRopeAppend(dtype, static_cast<const float*>(d_qkv.get()),
                             with_bias ? static_cast<const float*>(d_bias.get()) : nullptr,
                             static_cast<const float*>(d_cos.get()), static_cast<const float*>(d_sin.get()),
                             static_cast<const int32_t*>(d_positions.get()), static_cast<const int64_t*>(d_slots.get()),
                             rows, num_heads, num_kv_heads, d, kv, d_q.get(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  {
    SCOPED_TRACE("q");
    ExpectNear(Values(dtype, Download<uint16_t>(d_q, want_q.size())), want_q, RelTol(dtype), kAbsTol);
  }
  for (const bool is_k : {true, false}) {
    SCOPED_TRACE(is_k ? "pool k" : "pool v");
    const std::vector<uint16_t> got = Download<uint16_t>(is_k ? d_k : d_v, pool_elems);
    const std::vector<double>& want = is_k ? want_k : want_v;
    int written = 0, bad = 0;
    for (size_t e = 0; e < pool_elems; ++e) {
      if (std::isnan(want[e])) {
        if (got[e] != 0xffff && ++bad <= 5) ADD_FAILURE() << "untouched element " << e << " was written";
        continue;
      }
      ++written;
      const double err = std::fabs(LoadAs(dtype, got.data(), static_cast<int64_t>(e)) - want[e]);
      if (!(err <= RelTol(dtype) * std::fabs(want[e]) + kAbsTol) && ++bad <= 5) {
        ADD_FAILURE() << "element " << e << ": got " << LoadAs(dtype, got.data(), static_cast<int64_t>(e)) << ", want "
                      << want[e];
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(written, (rows - 2) * num_kv_heads * d);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayersRopeAppend,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(36, 64, 128),  // 36: the scalar path
                                            ::testing::Values(16, 64), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<RopeParams>& info) {
                           return absl::StrFormat("%s_d%d_c%d_%s", DTypeName(std::get<0>(info.param)),
                                                  std::get<1>(info.param), std::get<2>(info.param),
                                                  std::get<3>(info.param) ? "bias" : "nobias");
                         });

// ---------------------------------------------------------------------------
// Qwen3's per-head q/k RMSNorm (fp32 in place: fp32 arithmetic only, so a
// relative 1e-5 holds; v heads are bit-exact).

TEST(LayersQkNorm, MatchesFloat64) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const float eps = 1e-6f;
  const int rows = 11, num_heads = 8, num_kv_heads = 2, heads = num_heads + 2 * num_kv_heads;
  // 36: a partial lane round; 64 and 128: the model's; 256: the largest.
  for (int d : {36, 64, 128, 256}) {
    for (const bool with_bias : {false, true}) {
      SCOPED_TRACE(absl::StrFormat("head_dim %d, bias %d", d, static_cast<int>(with_bias)));
      const int width = heads * d;
      std::vector<float> qkv = Normal(rng, int64_t{rows} * width, 3.0f);
      for (int h = 0; h < heads; ++h) {  // heads of very different norms in row 0
        for (int i = 0; i < d; ++i) qkv[h * d + i] *= h % 3 == 0 ? 1e-3f : (h % 3 == 1 ? 1.0f : 100.0f);
      }
      const std::vector<float> bias = with_bias ? Normal(rng, width, 0.5f) : std::vector<float>();
      std::vector<float> q_weight = Normal(rng, d, 0.5f), k_weight = Normal(rng, d, 0.5f);
      for (float& w : q_weight) w += 1.0f;
      for (float& w : k_weight) w += 1.0f;

      std::vector<double> want_qk;  // every row's q and k heads, in order
      std::vector<float> want_v;    // every row's v heads: x + bias as the fp32 add gives it
      for (int r = 0; r < rows; ++r) {
        for (int h = 0; h < heads; ++h) {
          const float* x = qkv.data() + int64_t{r} * width + int64_t{h} * d;
          std::vector<float> y(d);
          for (int i = 0; i < d; ++i) y[i] = with_bias ? x[i] + bias[h * d + i] : x[i];
          if (h >= num_heads + num_kv_heads) {
            want_v.insert(want_v.end(), y.begin(), y.end());
            continue;
          }
          const std::vector<float>& w = h < num_heads ? q_weight : k_weight;
          double ss = 0;
          for (float v : y) ss += double{v} * v;
          const double inv = 1.0 / std::sqrt(ss / d + eps);
          for (int i = 0; i < d; ++i) want_qk.push_back(double{w[i]} * y[i] * inv);
        }
      }

      DeviceBuffer d_qkv = Upload(qkv), d_q = Upload(q_weight), d_k = Upload(k_weight);
      DeviceBuffer d_bias = with_bias ? Upload(bias) : DeviceBuffer();
      ASSERT_EQ(LaunchQkNorm(static_cast<float*>(d_qkv.get()),
                             with_bias ? static_cast<const float*>(d_bias.get()) : nullptr,
                             static_cast<const float*>(d_q.get()), static_cast<const float*>(d_k.get()), rows,
                             num_heads, num_kv_heads, d, eps, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = Download<float>(d_qkv, qkv.size());
      std::vector<float> got_qk, got_v;
      for (int r = 0; r < rows; ++r) {
        const auto row = got.begin() + int64_t{r} * width;
        got_qk.insert(got_qk.end(), row, row + (num_heads + num_kv_heads) * d);
        got_v.insert(got_v.end(), row + (num_heads + num_kv_heads) * d, row + width);
      }
      ExpectNear(got_qk, want_qk, 1e-5, 1e-6);
      ExpectBitEqual(got_v, want_v);
    }
  }
}

// ---------------------------------------------------------------------------
// SwiGLU.

TEST(LayersSwiGlu, MatchesFloat64) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  const int rows = 7;
  for (DType dtype : kStorageTypes) {
    for (int inter : {1376, 100}) {  // 8 columns per thread; the scalar path
      SCOPED_TRACE(absl::StrFormat("%s, inter %d", DTypeName(dtype), inter));
      std::vector<float> gate_up = Normal(rng, int64_t{rows} * 2 * inter, 4.0f);
      // Saturated and tiny gates in row 0.
      const float special[] = {-90.0f, -30.0f, -10.0f, -1e-3f, 0.0f, 1e-3f, 10.0f, 30.0f, 90.0f};
      for (int i = 0; i < static_cast<int>(std::size(special)); ++i) gate_up[i] = special[i];
      const Rounded in = Round(dtype, gate_up);
      std::vector<double> want(int64_t{rows} * inter);
      for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < inter; ++i) {
          const double g = in.values[int64_t{r} * 2 * inter + i], u = in.values[int64_t{r} * 2 * inter + inter + i];
          want[int64_t{r} * inter + i] = g / (1.0 + std::exp(-g)) * u;
        }
      }
      DeviceBuffer d_in = Upload(in.bits), d_out = Poisoned(want.size() * 2);
      ASSERT_EQ(LaunchSwiGlu(dtype, d_in.get(), rows, inter, d_out.get(), nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ExpectNear(Values(dtype, Download<uint16_t>(d_out, want.size())), want, RelTol(dtype), kAbsTol);
    }
  }
}

// ---------------------------------------------------------------------------
// Greedy sampling.

// The Sampler's greedy semantics in float64: (token, logprob), (-1, NaN) for
// a row with +inf or without a finite logit.
std::pair<int32_t, double> ReferenceGreedy(const float* row, int vocab) {
  float best = -kInf;
  int32_t token = -1;
  for (int i = 0; i < vocab; ++i) {
    if (row[i] > best) {  // NaN never wins
      best = row[i];
      token = i;
    }
  }
  if (token < 0 || best == kInf) return {-1, std::nan("")};
  double sum = 0;
  for (int i = 0; i < vocab; ++i) {
    if (std::isfinite(row[i])) sum += std::exp(double{row[i]} - best);
  }
  return {token, double{row[token]} - best - std::log(sum)};
}

TEST(LayersGreedy, MatchesFloat64Semantics) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (int vocab : {32000, 1001}) {  // float4 loads; scalar loads
    SCOPED_TRACE(absl::StrFormat("vocab %d", vocab));
    const int rows = 13;
    std::vector<float> logits = Normal(rng, int64_t{rows} * vocab, 3.0f);
    auto row = [&](int r) { return logits.data() + int64_t{r} * vocab; };
    auto set_max_at = [&](int r, std::initializer_list<int> ids) {  // a tie at `ids`
      const float m = *std::max_element(row(r), row(r) + vocab) + 1.0f;
      for (int id : ids) row(r)[id] = m;
    };
    // 0: plain. 1: a tie far apart. 2: ties within one float4 and across threads.
    set_max_at(1, {vocab - 1, 7, vocab / 2});
    set_max_at(2, {vocab - 2, 9, 8, 2049 % vocab});
    // 3: NaN (index 0 too) and -inf sprinkled, a NaN right after the maximum.
    for (int i = 0; i < vocab; i += 7) row(3)[i] = kNaN;
    for (int i = 3; i < vocab; i += 11) row(3)[i] = -kInf;
    row(3)[vocab / 3] = 1e3f;
    row(3)[vocab / 3 + 1] = kNaN;
    // 4: one +inf. 5: all -inf. 6: all NaN. 7: NaN and -inf only.
    row(4)[vocab / 5] = kInf;
    std::fill_n(row(5), vocab, -kInf);
    std::fill_n(row(6), vocab, kNaN);
    for (int i = 0; i < vocab; ++i) row(7)[i] = i % 2 ? kNaN : -kInf;
    // 8: a single finite logit. 9: large magnitudes. 10: +inf among NaN.
    std::fill_n(row(8), vocab, -kInf);
    row(8)[vocab - 3] = 2.5f;
    for (int i = 0; i < vocab; ++i) row(9)[i] *= 1e4f;
    row(10)[0] = kNaN;
    row(10)[vocab - 1] = kInf;
    // 11: all equal: token 0, logprob -log(vocab). 12: a tie at the last two ids.
    std::fill_n(row(11), vocab, 0.5f);
    set_max_at(12, {vocab - 2, vocab - 1});

    DeviceBuffer d_logits = Upload(logits);
    DeviceBuffer d_token = Poisoned(rows * 4), d_logprob = Poisoned(rows * 4);
    ASSERT_EQ(LaunchGreedy(static_cast<const float*>(d_logits.get()), rows, vocab, static_cast<int32_t*>(d_token.get()),
                           static_cast<float*>(d_logprob.get()), nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<int32_t> token = Download<int32_t>(d_token, rows);
    const std::vector<float> logprob = Download<float>(d_logprob, rows);
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE(absl::StrFormat("row %d", r));
      const auto [want_token, want_logprob] = ReferenceGreedy(row(r), vocab);
      EXPECT_EQ(token[r], want_token);
      if (want_token < 0) {
        EXPECT_TRUE(std::isnan(logprob[r])) << logprob[r];
      } else {
        EXPECT_NEAR(logprob[r], want_logprob, 1e-4);
      }
    }
    // The constructed rows' answers, independently of the reference.
    EXPECT_EQ(token[1], 7);
    EXPECT_EQ(token[2], 8);
    EXPECT_EQ(token[3], vocab / 3);
    for (int r : {4, 5, 6, 7, 10}) EXPECT_EQ(token[r], -1) << "row " << r;
    EXPECT_EQ(token[8], vocab - 3);
    EXPECT_NEAR(logprob[8], 0.0f, 1e-6);
    EXPECT_EQ(token[11], 0);
    EXPECT_NEAR(logprob[11], -std::log(static_cast<double>(vocab)), 1e-4);
    EXPECT_EQ(token[12], vocab - 2);
  }
}

// ---------------------------------------------------------------------------
// Full sampling: the device runs sample_row.h's algorithm block-wide; the
// same code run sequentially on the host (which workers/sampler's tests hold
// to the CPU Sampler) is the reference. Weights are bit-equal and masses are
// exact integers, so tokens must match exactly; logprobs differ only in the
// order of one float64 sum.

struct SampleLaunch {
  std::vector<float> logits;  // (rows, vocab)
  int vocab = 0;
  std::vector<SampleRowParams> params;
  std::vector<int32_t> history;
  std::vector<uint32_t> masks;  // the samples' token masks, concatenated
};

SampleRowParams RandomSampleParams(std::mt19937& rng, int vocab, int rows, int64_t history_size,
                                   std::vector<uint32_t>* masks) {
  auto pick = [&rng](auto const& options) { return options[rng() % options.size()]; };
  SampleRowParams p;
  p.row = static_cast<int32_t>(rng() % rows);
  p.temperature = pick(std::vector<float>{0.0f, 0.3f, 0.7f, 1.0f, 1.0f, 1.5f});
  p.top_k = pick(std::vector<int>{0, 0, 1, 2, 50, vocab - 1, vocab + 1});
  p.top_p = pick(std::vector<float>{1.0f, 1.0f, 0.95f, 0.5f, 0.1f});
  p.min_p = pick(std::vector<float>{0.0f, 0.0f, 0.05f, 0.3f});
  p.penalty = pick(std::vector<float>{1.0f, 1.0f, 1.3f, 0.8f});
  if (p.penalty != 1.0f && history_size > 0) {
    p.history_begin = static_cast<int32_t>(rng() % history_size);
    p.history_end = p.history_begin + static_cast<int32_t>(rng() % (history_size - p.history_begin + 1));
  }
  // Half the samples constrained: dense, sparse or short masks.
  if (rng() % 2 == 0) {
    const int words = (vocab + 31) / 32;
    p.mask_begin = static_cast<int32_t>(masks->size());
    p.mask_words = rng() % 4 == 0 ? 1 + static_cast<int32_t>(rng() % words) : words;
    const bool sparse = rng() % 2 == 0;
    for (int w = 0; w < p.mask_words; ++w) {
      const uint32_t bit = 1u << (rng() % 32);
      masks->push_back(sparse ? (rng() % 8 == 0 ? bit : 0u) : ~bit);
    }
    // A token of the first word allowed: one of the vocabulary's, unless it
    // is tiny (then the row has nothing allowed: -1 on both sides).
    (*masks)[p.mask_begin] |= 1u << (rng() % 32);
  }
  p.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  return p;
}

// Launches `c` with its rows split in blocks of `block` rows (as the GPU
// model does with its logits buffer) and checks every sample against the
// host run of the same algorithm.
void ExpectSampleMatchesHost(const SampleLaunch& c, int block) {
  const int rows = static_cast<int>(c.logits.size() / c.vocab);
  std::vector<SampleRowParams> order = c.params;  // grouped by block, as the model packs them
  std::stable_sort(order.begin(), order.end(),
                   [&](const SampleRowParams& a, const SampleRowParams& b) { return a.row / block < b.row / block; });
  const int64_t n = static_cast<int64_t>(order.size());
  DeviceBuffer d_params = Upload(order);
  DeviceBuffer d_history = c.history.empty() ? Alloc(4) : Upload(c.history);
  DeviceBuffer d_masks = c.masks.empty() ? Alloc(4) : Upload(c.masks);
  DeviceBuffer d_token = Poisoned(n * 4), d_logprob = Poisoned(n * 4);
  int64_t s0 = 0;
  for (int first = 0; first < rows; first += block) {
    const int in_block = std::min(block, rows - first);
    int64_t s1 = s0;
    while (s1 < n && order[s1].row < first + in_block) ++s1;
    // Only this block's rows are on the device, as in the model's buffer.
    std::vector<float> part(c.logits.begin() + int64_t{first} * c.vocab,
                            c.logits.begin() + int64_t{first + in_block} * c.vocab);
    DeviceBuffer d_logits = Upload(part);
    ASSERT_EQ(LaunchSample(static_cast<const float*>(d_logits.get()), in_block, c.vocab, first,
                           static_cast<const SampleRowParams*>(d_params.get()) + s0, s1 - s0,
                           static_cast<const int32_t*>(d_history.get()), static_cast<const uint32_t*>(d_masks.get()),
                           static_cast<int32_t*>(d_token.get()) + s0,
                           static_cast<float*>(d_logprob.get()) + s0, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    s0 = s1;
  }
  ASSERT_EQ(s0, n);
  const std::vector<int32_t> token = Download<int32_t>(d_token, n);
  const std::vector<float> logprob = Download<float>(d_logprob, n);
  for (int64_t s = 0; s < n; ++s) {
    const SampleRowParams& p = order[s];
    const SampleRowResult want =
        SampleRowOnHost(c.logits.data() + int64_t{p.row} * c.vocab, c.vocab, p, c.history.data(), c.masks.data());
    SCOPED_TRACE(absl::StrFormat("sample %d: row %d, T %g, top_k %d, top_p %g, min_p %g, penalty %g, mask %d+%d, u %g",
                                 s, p.row, p.temperature, p.top_k, p.top_p, p.min_p, p.penalty, p.mask_begin,
                                 p.mask_words, p.u));
    EXPECT_EQ(token[s], want.token);
    if (want.token < 0) {
      EXPECT_TRUE(std::isnan(logprob[s])) << logprob[s];
    } else {
      EXPECT_NEAR(logprob[s], want.logprob, 1e-5 * (1 + std::abs(want.logprob)));
    }
  }
}

TEST(LayersSample, MatchesTheHostRowAlgorithm) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  // Vocabularies: tiny, odd, a tile boundary, Llama 2, Llama 3, Qwen2.
  for (int vocab : {1, 7, 512, 1001, 32000, 128256, 152064}) {
    SCOPED_TRACE(absl::StrFormat("vocab %d", vocab));
    SampleLaunch c;
    c.vocab = vocab;
    const int rows = 6;
    c.logits = Normal(rng, int64_t{rows} * vocab, vocab > 1000 ? 3.0f : 1.0f);
    auto row = [&](int r) { return c.logits.data() + int64_t{r} * vocab; };
    // Row 1: NaN and -inf sprinkled. Row 2: few distinct values (ties at the
    // cuts). Row 3: a +inf (every sample of it gets -1). Row 4: all equal.
    for (int i = 0; i < vocab; i += 13) row(1)[i] = kNaN;
    for (int i = 5; i < vocab; i += 17) row(1)[i] = -kInf;
    for (int i = 0; i < vocab; ++i) row(2)[i] = static_cast<float>(rng() % 3) * 0.5f;
    row(3)[vocab / 2] = kInf;
    std::fill_n(row(4), vocab, 0.25f);
    c.history.resize(300);
    for (int32_t& t : c.history) t = static_cast<int32_t>(rng() % vocab);
    for (int s = 0; s < 48; ++s) c.params.push_back(RandomSampleParams(rng, vocab, rows, 300, &c.masks));
    ExpectSampleMatchesHost(c, 4);
    ExpectSampleMatchesHost(c, rows);
  }
}

TEST(LayersSample, RefusesContractBreachesWithoutTouchingMemory) {
  SKIP_WITHOUT_GPU();
  const int vocab = 100;
  std::vector<float> logits(2 * vocab, 0.0f);
  DeviceBuffer d_logits = Upload(logits);
  std::vector<SampleRowParams> params(4);
  params[0].row = 5;  // outside the launch's rows [3, 5)
  params[1].row = 3;
  params[1].penalty = 1.5f;  // a penalty, but no history passed
  params[2].row = 4;
  params[2].temperature = 1.0f;  // a valid one
  params[3].row = 4;
  params[3].mask_begin = 0;  // a mask, but no mask array passed
  params[3].mask_words = 1;
  DeviceBuffer d_params = Upload(params);
  DeviceBuffer d_token = Poisoned(16), d_logprob = Poisoned(16);
  ASSERT_EQ(LaunchSample(static_cast<const float*>(d_logits.get()), 2, vocab, 3,
                         static_cast<const SampleRowParams*>(d_params.get()), 4, nullptr, nullptr,
                         static_cast<int32_t*>(d_token.get()), static_cast<float*>(d_logprob.get()), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> token = Download<int32_t>(d_token, 4);
  EXPECT_EQ(token[0], -1);
  EXPECT_EQ(token[1], -1);
  EXPECT_GE(token[2], 0);
  EXPECT_LT(token[2], vocab);
  EXPECT_EQ(token[3], -1);

  // With masks: one longer than the vocabulary's 4 words is refused; one
  // that allows only token 42 draws it, greedy or not, on a flat row.
  const std::vector<uint32_t> masks = {0, 1u << 10, 0, 0, 0};
  std::vector<SampleRowParams> masked(3);
  for (SampleRowParams& p : masked) {
    p.row = 3;
    p.mask_begin = 0;
    p.mask_words = 4;
  }
  masked[0].mask_words = 5;
  masked[2].temperature = 1.0f;
  DeviceBuffer d_masks = Upload(masks), d_masked = Upload(masked);
  ASSERT_EQ(LaunchSample(static_cast<const float*>(d_logits.get()), 2, vocab, 3,
                         static_cast<const SampleRowParams*>(d_masked.get()), 3, nullptr,
                         static_cast<const uint32_t*>(d_masks.get()), static_cast<int32_t*>(d_token.get()),
                         static_cast<float*>(d_logprob.get()), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> masked_token = Download<int32_t>(d_token, 3);
  const std::vector<float> masked_logprob = Download<float>(d_logprob, 3);
  EXPECT_EQ(masked_token[0], -1);
  for (int s = 1; s < 3; ++s) {
    EXPECT_EQ(masked_token[s], 42) << "sample " << s;
    EXPECT_EQ(masked_logprob[s], 0.0f) << "the masked row's log-softmax, sample " << s;
  }
}

// ---------------------------------------------------------------------------
// Capture: the launches only enqueue work, so a captured graph replays on
// new inputs written to the same buffers.

TEST(LayersGraph, CapturedEmbedAndNormReplayOnNewTokens) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  const DType dtype = DType::kBFloat16;
  const int vocab = 20, hidden = 256, rows = 5;
  const float eps = 1e-6f;
  const Rounded table = Round(dtype, Normal(rng, int64_t{vocab} * hidden, 1.0f));
  std::vector<float> weight = Normal(rng, hidden, 0.1f);
  for (float& w : weight) w += 1.0f;
  DeviceBuffer d_table = Upload(table.bits), d_weight = Upload(weight);
  DeviceBuffer d_tokens = Alloc(rows * 4), d_x = Alloc(int64_t{rows} * hidden * 4);
  DeviceBuffer d_out = Alloc(int64_t{rows} * hidden * 2);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const cudaError_t embed = LaunchEmbed(dtype, d_table.get(), static_cast<const int32_t*>(d_tokens.get()), rows, hidden,
                                        static_cast<float*>(d_x.get()), stream);
  const cudaError_t norm =
      LaunchAddRmsNorm(dtype, static_cast<float*>(d_x.get()), nullptr, nullptr,
                       static_cast<const float*>(d_weight.get()), rows, hidden, eps, d_out.get(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(embed, cudaSuccess);
  ASSERT_EQ(norm, cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(absl::StrFormat("step %d", step));
    std::vector<int32_t> tokens(rows);
    for (int r = 0; r < rows; ++r) tokens[r] = (7 * r + 3 * step + 1) % vocab;
    ASSERT_EQ(cudaMemcpyAsync(d_tokens.get(), tokens.data(), rows * 4, cudaMemcpyHostToDevice, stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(int64_t{rows} * hidden);
    for (int r = 0; r < rows; ++r) {
      const float* e = table.values.data() + int64_t{tokens[r]} * hidden;
      double ss = 0;
      for (int k = 0; k < hidden; ++k) ss += double{e[k]} * e[k];
      const double inv = 1.0 / std::sqrt(ss / hidden + eps);
      for (int k = 0; k < hidden; ++k) want[int64_t{r} * hidden + k] = double{weight[k]} * e[k] * inv;
    }
    ExpectNear(Values(dtype, Download<uint16_t>(d_out, want.size())), want, RelTol(dtype), kAbsTol);
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace chunkattn::cuda
