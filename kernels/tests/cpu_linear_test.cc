// LinearRows (kernels/cpu/attention.h): the decode form of a Linear layer,
// against a float64 reference on random shapes, for each ISA and weight
// dtype (fp32, fp16, bf16, weight-only int8 with any block), threaded and
// not; a row's result independent of its batch; the prefill path's weight
// conversion exact; bad shapes refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/api/dtype.h"
#include "kernels/cpu/attention.h"
#include "base/sanitizer.h"
#include "base/thread_pool.h"

namespace chunkattn {
namespace {

// Weights stored in `dtype`, and their exact fp32 values.
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

Weights RandomWeights(DType dtype, int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.5f);
  Weights w;
  w.bytes.resize(static_cast<size_t>(count * DTypeBytes(dtype)));
  w.values.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const float f = normal(rng);
    if (dtype == DType::kFloat32) {
      std::memcpy(w.bytes.data() + 4 * i, &f, 4);
      w.values[i] = f;
    } else {
      const uint16_t h = dtype == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
      std::memcpy(w.bytes.data() + 2 * i, &h, 2);
      w.values[i] = dtype == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
    }
  }
  return w;
}

// Every ISA this CPU runs, AVX-512 included. The tests of paths AVX-512
// leaves to the AVX2 code loop over portable and AVX2 alone; AVX512EqualsAvx2
// shows those paths reach the AVX2 code.
std::vector<cpu::Isa> SupportedIsas() {
  std::vector<cpu::Isa> out;
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    if (cpu::IsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

// c (rows, n) against a (rows, k) times values (n, k)^T in float64: fp32
// accumulation over k terms is at most k roundings of the terms' magnitude.
// `rounded_groups`: the kernel rounds the activations to int16 per group of
// 32 columns (int8 weights, LinearArgs::aq), which moves each a(r, i) by at
// most half its group's step max |a| / 32767 (and an ulp of the reciprocal it
// multiplies by): that times |w| is added to the bound.
void ExpectEqualsFloat64(const std::vector<float>& a, const std::vector<float>& values, int64_t rows, int64_t k,
                         int64_t n, const std::vector<float>& c, const std::string& where,
                         bool rounded_groups = false) {
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> half_step(static_cast<size_t>(k), 0.0);
    for (int64_t g = 0; rounded_groups && g < k; g += 32) {
      double amax = 0;
      for (int64_t i = g; i < g + 32; ++i) amax = std::max(amax, std::fabs(double{a[r * k + i]}));
      for (int64_t i = g; i < g + 32; ++i) half_step[i] = 0.5 * amax / 32767 * (1 + 1e-6);
    }
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, mag = 0, rounding = 0;
      for (int64_t i = 0; i < k; ++i) {
        want += double{a[r * k + i]} * values[j * k + i];
        mag += std::fabs(double{a[r * k + i]} * values[j * k + i]);
        rounding += half_step[i] * std::fabs(double{values[j * k + i]});
      }
      ASSERT_NEAR(c[r * n + j], want, k * 6e-8 * mag + rounding + 1e-6) << where << " at (" << r << ", " << j << ")";
    }
  }
}

TEST(LinearRowsTest, EqualsFloat64ReferenceOnRandomShapes) {
  std::mt19937 rng(7);
  ThreadPool pool(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2}) {
    if (!cpu::IsaSupported(isa)) continue;
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (int trial = 0; trial < 12; ++trial) {
        const int64_t rows = 1 + rng() % 9;          // odd and even: both row tiles
        const int64_t k = 8 * (1 + rng() % 40);      // up to 320
        const int64_t n = 1 + rng() % 1100;          // over the threaded bound, with a ragged tail
        const Weights w = RandomWeights(dtype, n * k, rng);
        std::vector<float> a(static_cast<size_t>(rows * k));
        for (float& x : a) x = normal(rng);
        std::vector<float> c(static_cast<size_t>(rows * n), NAN);
        ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, w.bytes.data(), dtype, n, c.data(),
                                    trial % 2 ? &pool : nullptr, isa)
                        .ok());
        ExpectEqualsFloat64(a, w.values, rows, k, n, c,
                            absl::StrFormat("%s %s rows %d k %d n %d", cpu::IsaName(isa), DTypeName(dtype), rows,
                                            k, n));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// The two larger "a row's result does not depend on its batch" tests compare
// every row alone with the batch, but every fifth in a sanitizer build (each
// row alone is a pass over the whole matrix): 5 is 1 mod 4, so on their
// 37-row batches those rows still take every place in the kernels' 4-row
// tiles.
constexpr int64_t kRowStride = kSanitizerBuild ? 5 : 1;

// Also across the 16-bit kernels' two paths: weights converted per row pair
// (few rows) or once into an fp32 buffer for all rows (from 3 rows on, in
// segments of 512 columns: k = 1160 spans three, rows = 37 two row blocks).
TEST(LinearRowsTest, ARowsResultDoesNotDependOnItsBatch) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2}) {
    if (!cpu::IsaSupported(isa)) continue;
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (const auto& [rows, k] : {std::pair<int64_t, int64_t>{7, 264}, {37, 1160}}) {
        const int64_t n = 777;
        const Weights w = RandomWeights(dtype, n * k, rng);
        std::vector<float> batch(static_cast<size_t>(rows * k));
        for (float& x : batch) x = normal(rng);
        std::vector<float> all(static_cast<size_t>(rows * n));
        ASSERT_TRUE(cpu::LinearRows(batch.data(), rows, k, w.bytes.data(), dtype, n, all.data(), &pool, isa).ok());
        for (int64_t r = 0; r < rows; r += kRowStride) {
          std::vector<float> one(static_cast<size_t>(n));
          ASSERT_TRUE(
              cpu::LinearRows(batch.data() + r * k, 1, k, w.bytes.data(), dtype, n, one.data(), nullptr, isa).ok());
          ASSERT_EQ(std::memcmp(one.data(), all.data() + r * n, sizeof(float) * n), 0)
              << cpu::IsaName(isa) << " " << DTypeName(dtype) << " row " << r << " of " << rows;
        }
      }
    }
  }
}

// Weight-only int8 as the loader makes it: per block of `block` columns of a
// row, the fp16 scale = max |w| / 127 rounded up (cpu::Int8Scale) and q =
// round(w / scale); `values` holds what the kernels must read, the fp32
// product q * scale.
struct Int8Weights {
  std::vector<int8_t> q;
  std::vector<uint16_t> scales;
  std::vector<float> values;
  std::vector<float> original;  // the fp32 weights q and scales round
};

Int8Weights RandomInt8(int64_t n, int64_t k, int64_t block, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.5f);
  Int8Weights w;
  w.q.resize(static_cast<size_t>(n * k));
  w.values.resize(w.q.size());
  w.original.resize(w.q.size());
  for (int64_t b = 0; b < n * k; b += block) {
    std::vector<float> x(static_cast<size_t>(block));
    float amax = 0;
    for (float& v : x) {
      v = normal(rng);
      amax = std::max(amax, std::fabs(v));
    }
    if (rng() % 17 == 0) {  // an all-zero block: scale 0
      std::fill(x.begin(), x.end(), 0.0f);
      amax = 0;
    }
    w.scales.push_back(cpu::Int8Scale(amax));
    const float scale = HalfToFloat(w.scales.back());
    for (int64_t i = 0; i < block; ++i) {
      const float q = scale > 0 ? std::nearbyint(x[i] / scale) : 0.0f;
      EXPECT_LE(std::fabs(q), 127.0f) << "a scale rounded up keeps q in int8";
      w.q[b + i] = static_cast<int8_t>(q);
      w.values[b + i] = static_cast<float>(w.q[b + i]) * scale;  // +0 where q was -0
      w.original[b + i] = x[i];
    }
  }
  return w;
}

// The kernels' view of `w`, quantized with `block` columns per scale.
cpu::WeightView ViewOf(const Int8Weights& w, int64_t block) {
  cpu::WeightView view;
  view.data = w.q.data();
  view.scales = w.scales.data();
  view.block = block;
  return view;
}

// `w`'s q in the decode kernel's interleaved layout (rows a multiple of 4),
// and its view.
struct InterleavedInt8 {
  std::vector<int8_t> q;
  cpu::WeightView view;
};
InterleavedInt8 Interleave(const Int8Weights& w, int64_t k) {
  InterleavedInt8 out;
  out.q.resize(w.q.size());
  for (int64_t row = 0; row < static_cast<int64_t>(w.q.size()) / k; ++row) {
    for (int64_t c = 0; c < k; ++c) out.q[cpu::Int8InterleavedIndex(row, c, k)] = w.q[row * k + c];
  }
  out.view.data = out.q.data();
  out.view.scales = w.scales.data();
  out.view.block = 32;
  out.view.interleaved = true;
  return out;
}

// The divisors of k that are multiples of 8 (int8 blocks LinearRows takes).
std::vector<int64_t> Blocks(int64_t k) {
  std::vector<int64_t> out;
  for (int64_t b = 8; b <= k; b += 8) {
    if (k % b == 0) out.push_back(b);
  }
  return out;
}

// Blocks that are multiples of 32 take the integer path (activations rounded
// to int16 per 32 columns), others widen the weights; both against the
// float64 product of the unrounded activations, the integer path allowed its
// rounding (ExpectEqualsFloat64). Activations of mixed magnitudes, so a
// group's step comes from its own largest value.
TEST(LinearRowsTest, Int8EqualsFloat64ReferenceOnRandomShapes) {
  std::mt19937 rng(13);
  ThreadPool pool(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int integer_path = 0;
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2}) {
    if (!cpu::IsaSupported(isa)) continue;
    for (int trial = 0; trial < 36; ++trial) {
      const int64_t rows = 1 + rng() % 9;
      int64_t k = 8 * (1 + rng() % 40);
      if (trial % 3 == 0) k = 32 * (1 + rng() % 12);  // a multiple of 32: the integer path
      const std::vector<int64_t> blocks = Blocks(k);
      const int64_t block =
          trial % 3 == 0 ? (trial % 2 ? 32 : k) : trial % 4 == 0 ? k : blocks[rng() % blocks.size()];
      const int64_t n = 1 + rng() % 1100;
      const Int8Weights w = RandomInt8(n, k, block, rng);
      std::vector<float> a(static_cast<size_t>(rows * k));
      for (float& x : a) x = normal(rng) * (rng() % 8 == 0 ? 50.0f : 1.0f);
      std::vector<float> c(static_cast<size_t>(rows * n), NAN);
      const cpu::WeightView view = ViewOf(w, block);
      ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, view, n, c.data(), trial % 2 ? &pool : nullptr, isa).ok());
      const bool rounded = block % 32 == 0;
      integer_path += rounded;
      ExpectEqualsFloat64(a, w.values, rows, k, n, c,
                          absl::StrFormat("%s int8 rows %d k %d block %d n %d", cpu::IsaName(isa), rows, k, block, n),
                          rounded);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  EXPECT_GE(integer_path, 12);
}

// The integer path's error is a small fraction of what rounding the weights
// to int8 costs (against the fp32 weights they came from), on a layer's
// shape with an outlier column, which coarsens its group's step.
TEST(LinearRowsTest, Int8ActivationRoundingIsSmallBesideTheWeights) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 3, k = 1024, n = 256;
  const Int8Weights w = RandomInt8(n, k, 32, rng);
  std::vector<float> a(static_cast<size_t>(rows * k));
  for (float& x : a) x = normal(rng);
  a[5] = 300.0f;
  const cpu::WeightView view = ViewOf(w, 32);
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2}) {
    if (!cpu::IsaSupported(isa)) continue;
    std::vector<float> c(static_cast<size_t>(rows * n));
    ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, view, n, c.data(), nullptr, isa).ok());
    double activations = 0, weights = 0;  // root mean square errors
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double rounded = 0, exact = 0;
        for (int64_t i = 0; i < k; ++i) {
          rounded += double{a[r * k + i]} * w.values[j * k + i];
          exact += double{a[r * k + i]} * w.original[j * k + i];
        }
        activations += (c[r * n + j] - rounded) * (c[r * n + j] - rounded);
        weights += (rounded - exact) * (rounded - exact);
      }
    }
    EXPECT_LT(std::sqrt(activations), std::sqrt(weights) / 50) << cpu::IsaName(isa);
    EXPECT_GT(activations, 0) << cpu::IsaName(isa);  // the rounding is real, and measured
  }
}

// A NaN or an infinity among a row's activations makes that row's outputs
// NaN (as fp32 arithmetic would make them NaN or infinite), never a finite
// value from a saturated integer; the other rows are untouched.
TEST(LinearRowsTest, Int8NonFiniteActivationsGiveNaN) {
  std::mt19937 rng(29);
  const int64_t rows = 3, k = 64, n = 8;
  const Int8Weights w = RandomInt8(n, k, 32, rng);
  const cpu::WeightView view = ViewOf(w, 32);
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2}) {
    if (!cpu::IsaSupported(isa)) continue;
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> a(static_cast<size_t>(rows * k), 0.25f);
      a[k + 40] = bad;  // row 1, second group
      std::vector<float> c(static_cast<size_t>(rows * n));
      ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, view, n, c.data(), nullptr, isa).ok());
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_TRUE(std::isnan(c[n + j])) << cpu::IsaName(isa) << " " << bad << " column " << j;
        EXPECT_TRUE(std::isfinite(c[j]) && std::isfinite(c[2 * n + j])) << cpu::IsaName(isa) << " column " << j;
      }
    }
  }
}

TEST(LinearRowsTest, Int8RowsResultDoesNotDependOnItsBatch) {
  std::mt19937 rng(17);
  ThreadPool pool(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2}) {
    if (!cpu::IsaSupported(isa)) continue;
    // A block that straddles the 512-column segments (24), and per row; the
    // integer path (blocks of 32 and 96) in 4-, 2- and 1-row tiles.
    for (const auto& [rows, k, block] :
         {std::tuple<int64_t, int64_t, int64_t>{7, 288, 32}, {37, 1080, 24}, {5, 1080, 1080}, {11, 1024, 32},
          {6, 1056, 96}}) {
      const int64_t n = 777;
      const Int8Weights w = RandomInt8(n, k, block, rng);
      const cpu::WeightView view = ViewOf(w, block);
      std::vector<float> batch(static_cast<size_t>(rows * k));
      for (float& x : batch) x = normal(rng);
      std::vector<float> all(static_cast<size_t>(rows * n));
      ASSERT_TRUE(cpu::LinearRows(batch.data(), rows, k, view, n, all.data(), &pool, isa).ok());
      for (int64_t r = 0; r < rows; r += kRowStride) {
        std::vector<float> one(static_cast<size_t>(n));
        ASSERT_TRUE(cpu::LinearRows(batch.data() + r * k, 1, k, view, n, one.data(), nullptr, isa).ok());
        ASSERT_EQ(std::memcmp(one.data(), all.data() + r * n, sizeof(float) * n), 0)
            << cpu::IsaName(isa) << " block " << block << " row " << r << " of " << rows;
      }
    }
  }
}

// The interleaved layout: within each 256 columns a permutation, column
// pairs kept adjacent, block m's pairs 16 values apart from lane m on; over
// the matrix a permutation in which a group of 4 rows' span s is one
// stretch of 1024 bytes, row by row.
// Int8Scale is the smallest half at least amax / 127, over every magnitude a
// weight block can have: subnormal halves, normal ones, and past the largest
// (saturated); 0 only for a zero block.
TEST(Int8LayoutTest, ScaleIsTheSmallestHalfAtLeastAmaxOver127) {
  EXPECT_EQ(cpu::Int8Scale(0.0f), 0);
  EXPECT_EQ(cpu::Int8Scale(127.0f), FloatToHalf(1.0f));
  EXPECT_EQ(cpu::Int8Scale(1e30f), 0x7bff);
  EXPECT_EQ(cpu::Int8Scale(std::numeric_limits<float>::infinity()), 0x7bff);
  EXPECT_EQ(cpu::Int8Scale(1e-30f), 1) << "the smallest subnormal, never 0";
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exponent(-30.0f, 24.0f);
  for (int i = 0; i < 100000; ++i) {
    const float amax = std::exp2(exponent(rng)), want = amax / 127.0f;
    const uint16_t h = cpu::Int8Scale(amax);
    if (want >= 65504.0f) {
      ASSERT_EQ(h, 0x7bff);
      continue;
    }
    ASSERT_GE(HalfToFloat(h), want) << amax;
    ASSERT_LT(HalfToFloat(static_cast<uint16_t>(h - 1)), want) << amax;
  }
}

TEST(Int8LayoutTest, InterleavedColumnIsAPermutationOfEachSpan) {
  EXPECT_TRUE(cpu::Int8Interleaves(8, 512, 32));
  EXPECT_FALSE(cpu::Int8Interleaves(8, 288, 32));
  EXPECT_FALSE(cpu::Int8Interleaves(8, 512, 64));
  EXPECT_FALSE(cpu::Int8Interleaves(6, 512, 32));
  const int64_t n = 8, k = 768;
  std::vector<int> stored(n * k, 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t at = cpu::Int8InterleavedIndex(j, c, k);
      ASSERT_GE(at, 0);
      ASSERT_LT(at, n * k);
      ++stored[at];
      const int64_t stretch = (j / 4) * 4 * k + (c / 256) * 1024;  // the group's span s
      EXPECT_EQ(at - stretch - j % 4 * 256, cpu::Int8InterleavedColumn(c) % 256) << j << " " << c;
    }
  }
  for (int count : stored) ASSERT_EQ(count, 1);
  for (int64_t span = 0; span < 3; ++span) {
    std::vector<int> seen(256, 0);
    for (int64_t c = span * 256; c < span * 256 + 256; ++c) {
      const int64_t at = cpu::Int8InterleavedColumn(c);
      ASSERT_GE(at, span * 256);
      ASSERT_LT(at, span * 256 + 256);
      ++seen[at - span * 256];
      if (c % 2 == 1) {
        EXPECT_EQ(at, cpu::Int8InterleavedColumn(c - 1) + 1);
      }
      EXPECT_EQ((at % 16) / 2, (c % 256) / 32);  // the lane of c's block
    }
    for (int n : seen) ASSERT_EQ(n, 1);
  }
}

// Interleaved rows (the model's int8 layout for k a multiple of 256) against
// the float64 reference, the integer path's rounding allowed, on random
// shapes, threaded or not, with activations of mixed magnitudes.
TEST(LinearRowsTest, Int8InterleavedEqualsFloat64Reference) {
  std::mt19937 rng(31);
  ThreadPool pool(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (cpu::Isa isa : SupportedIsas()) {
    // A quarter of the shapes under the sanitizers (the float64 reference is most of the time).
    for (int trial = 0; trial < SanitizerSlice(16, 4); ++trial) {
      const int64_t rows = 1 + rng() % 9, k = 256 * (1 + rng() % 6), n = 4 * (1 + rng() % 275);
      const Int8Weights w = RandomInt8(n, k, 32, rng);
      const InterleavedInt8 iw = Interleave(w, k);
      std::vector<float> a(static_cast<size_t>(rows * k));
      for (float& x : a) x = normal(rng) * (rng() % 8 == 0 ? 50.0f : 1.0f);
      std::vector<float> c(static_cast<size_t>(rows * n), NAN);
      ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, iw.view, n, c.data(), trial % 2 ? &pool : nullptr, isa).ok());
      ExpectEqualsFloat64(a, w.values, rows, k, n, c,
                          absl::StrFormat("%s interleaved int8 rows %d k %d n %d", cpu::IsaName(isa), rows, k, n),
                          true);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// AVX-512's kernels give AVX2's results bit for bit (kernels_avx512.cc), on
// every layout and dtype, at every batch size from 1 to 20 (its 8-, 4-, 2-
// and 1-row tiles), threaded and not: the model's packed fp32/16-bit rows
// and interleaved int8 rows, which it computes itself, and the row-major,
// column-order int8 and widened int8 shapes it hands to the AVX2 code.
TEST(LinearRowsTest, Avx512EqualsAvx2BitForBit) {
  if (!cpu::IsaSupported(cpu::Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 F/BW/VL/VNNI on this CPU";
  std::mt19937 rng(53);
  ThreadPool pool(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto expect_same = [&](const cpu::WeightView& view, int64_t rows, int64_t k, int64_t n, const std::string& what) {
    std::vector<float> a(static_cast<size_t>(rows * k));
    for (float& x : a) x = normal(rng) * (rng() % 8 == 0 ? 50.0f : 1.0f);
    ThreadPool* threads = rng() % 2 ? &pool : nullptr;
    std::vector<float> avx2(static_cast<size_t>(rows * n), NAN), avx512(avx2.size(), NAN);
    ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, view, n, avx2.data(), threads, cpu::Isa::kAvx2).ok());
    ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, view, n, avx512.data(), threads, cpu::Isa::kAvx512).ok());
    ASSERT_EQ(std::memcmp(avx2.data(), avx512.data(), avx2.size() * sizeof(float)), 0)
        << what << " rows " << rows << " k " << k << " n " << n;
  };
  // Every third batch size under the sanitizers: 1, 4, 7, ... 19 still take
  // every tile (19 = 8 + 8 + 2 + 1, 13 = 8 + 4 + 1).
  for (int64_t rows = 1; rows <= 20; rows += kSanitizerBuild ? 3 : 1) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const int64_t size = DTypeBytes(dtype);
      const int64_t k = 8 * (1 + rng() % 80), n = 4 * (1 + rng() % 160);
      const Weights w = RandomWeights(dtype, n * k, rng);
      std::vector<uint8_t> packed(w.bytes.size());
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < k; ++i) {
          std::memcpy(packed.data() + cpu::PackedIndex(j, i, k) * size, w.bytes.data() + (j * k + i) * size, size);
        }
      }
      cpu::WeightView view;
      view.data = packed.data();
      view.dtype = dtype;
      view.packed = true;
      expect_same(view, rows, k, n, std::string("packed ") + DTypeName(dtype));
      view.data = w.bytes.data();
      view.packed = false;
      expect_same(view, rows, k, n, std::string("row-major ") + DTypeName(dtype));
      if (::testing::Test::HasFatalFailure()) return;
    }
    const int64_t k = 256 * (1 + rng() % 5), n = 4 * (1 + rng() % 150);
    const Int8Weights w = RandomInt8(n, k, 32, rng);
    expect_same(Interleave(w, k).view, rows, k, n, "interleaved int8");
    expect_same(ViewOf(w, 32), rows, k, n - 1, "column-order int8");
    const Int8Weights w24 = RandomInt8(n, 264, 24, rng);
    expect_same(ViewOf(w24, 24), rows, 264, n, "widened int8");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Both ISAs sum the same exact integers and scale them in the same order.
TEST(LinearRowsTest, Int8InterleavedIsaAgree) {
  if (!cpu::IsaSupported(cpu::Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(37);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 3, k = 768, n = 132;
  const Int8Weights w = RandomInt8(n, k, 32, rng);
  const InterleavedInt8 iw = Interleave(w, k);
  std::vector<float> a(static_cast<size_t>(rows * k));
  for (float& x : a) x = normal(rng);
  std::vector<float> portable(static_cast<size_t>(rows * n)), avx2(portable.size());
  ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, iw.view, n, portable.data(), nullptr, cpu::Isa::kPortable).ok());
  ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, iw.view, n, avx2.data(), nullptr, cpu::Isa::kAvx2).ok());
  for (size_t i = 0; i < avx2.size(); ++i) EXPECT_NEAR(avx2[i], portable[i], 1e-5f * (1 + std::fabs(portable[i])));
}

TEST(LinearRowsTest, Int8InterleavedRowsResultDoesNotDependOnItsBatch) {
  std::mt19937 rng(41);
  ThreadPool pool(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (cpu::Isa isa : SupportedIsas()) {
    for (const auto& [rows, k] : {std::pair<int64_t, int64_t>{7, 512}, {4, 1024}, {2, 256}}) {
      const int64_t n = 780;  // the threads' pieces (ShrinkingPieces) end with one of 16 rows
      const Int8Weights w = RandomInt8(n, k, 32, rng);
      const InterleavedInt8 iw = Interleave(w, k);
      std::vector<float> batch(static_cast<size_t>(rows * k));
      for (float& x : batch) x = normal(rng);
      std::vector<float> all(static_cast<size_t>(rows * n));
      ASSERT_TRUE(cpu::LinearRows(batch.data(), rows, k, iw.view, n, all.data(), &pool, isa).ok());
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> one(static_cast<size_t>(n));
        ASSERT_TRUE(cpu::LinearRows(batch.data() + r * k, 1, k, iw.view, n, one.data(), nullptr, isa).ok());
        ASSERT_EQ(std::memcmp(one.data(), all.data() + r * n, sizeof(float) * n), 0)
            << cpu::IsaName(isa) << " k " << k << " row " << r << " of " << rows;
      }
    }
  }
}

TEST(LinearRowsTest, Int8InterleavedNonFiniteActivationsGiveNaN) {
  std::mt19937 rng(43);
  const int64_t rows = 3, k = 256, n = 8;
  const Int8Weights w = RandomInt8(n, k, 32, rng);
  const InterleavedInt8 iw = Interleave(w, k);
  for (cpu::Isa isa : SupportedIsas()) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> a(static_cast<size_t>(rows * k), 0.25f);
      a[k + 200] = bad;  // row 1, block 6
      std::vector<float> c(static_cast<size_t>(rows * n));
      ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, iw.view, n, c.data(), nullptr, isa).ok());
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_TRUE(std::isnan(c[n + j])) << cpu::IsaName(isa) << " " << bad << " column " << j;
        EXPECT_TRUE(std::isfinite(c[j]) && std::isfinite(c[2 * n + j])) << cpu::IsaName(isa) << " column " << j;
      }
    }
  }
}

// The prefill path reads interleaved rows back in column order, exactly.
TEST(WeightRowsToFloatTest, Int8InterleavedConvertsExactly) {
  std::mt19937 rng(47);
  ThreadPool pool(2);
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2}) {
    if (!cpu::IsaSupported(isa)) continue;
    for (int trial = 0; trial < 6; ++trial) {
      const int64_t k = 256 * (1 + rng() % 4), n = 4 * (1 + rng() % 75);
      const int64_t j0 = rng() % n, j1 = j0 + 1 + rng() % (n - j0);  // at least one row (memcmp of none is UB)
      const Int8Weights w = RandomInt8(n, k, 32, rng);
      const InterleavedInt8 iw = Interleave(w, k);
      std::vector<float> out(static_cast<size_t>((j1 - j0) * k), NAN);
      ASSERT_TRUE(cpu::WeightRowsToFloat(iw.view, k, j0, j1, out.data(), trial % 2 ? &pool : nullptr, isa).ok());
      ASSERT_EQ(std::memcmp(out.data(), w.values.data() + j0 * k, out.size() * sizeof(float)), 0)
          << cpu::IsaName(isa) << " k " << k << " rows [" << j0 << ", " << j1 << ")";
    }
  }
}

// The prefill path's conversion: exactly the values the decode kernel reads,
// for any k (tails under 8 included) and any int8 block dividing k.
TEST(WeightRowsToFloatTest, ConvertsExactlyForEveryDtypeAndOddShapes) {
  std::mt19937 rng(19);
  ThreadPool pool(2);
  for (cpu::Isa isa : {cpu::Isa::kPortable, cpu::Isa::kAvx2}) {
    if (!cpu::IsaSupported(isa)) continue;
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t k = 1 + rng() % 300;  // odd sizes too
      const int64_t n = 1 + rng() % 700;
      const int64_t j0 = rng() % n, j1 = j0 + rng() % (n - j0 + 1);
      ThreadPool* threads = trial % 2 ? &pool : nullptr;
      for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        const Weights w = RandomWeights(dtype, n * k, rng);
        cpu::WeightView view;
        view.data = w.bytes.data();
        view.dtype = dtype;
        std::vector<float> out(static_cast<size_t>((j1 - j0) * k), NAN);
        ASSERT_TRUE(cpu::WeightRowsToFloat(view, k, j0, j1, out.data(), threads, isa).ok());
        ASSERT_EQ(std::memcmp(out.data(), w.values.data() + j0 * k, out.size() * sizeof(float)), 0)
            << cpu::IsaName(isa) << " " << DTypeName(dtype) << " k " << k << " rows [" << j0 << ", " << j1 << ")";
      }
      std::vector<int64_t> divisors;
      for (int64_t b = 1; b <= k; ++b) {
        if (k % b == 0) divisors.push_back(b);
      }
      const int64_t block = divisors[rng() % divisors.size()];
      const Int8Weights w = RandomInt8(n, k, block, rng);
      const cpu::WeightView view = ViewOf(w, block);
      std::vector<float> out(static_cast<size_t>((j1 - j0) * k), NAN);
      ASSERT_TRUE(cpu::WeightRowsToFloat(view, k, j0, j1, out.data(), threads, isa).ok());
      ASSERT_EQ(std::memcmp(out.data(), w.values.data() + j0 * k, out.size() * sizeof(float)), 0)
          << cpu::IsaName(isa) << " int8 k " << k << " block " << block << " rows [" << j0 << ", " << j1 << ")";
    }
  }
}

// Packed weights (packed_layout.h), fp32, fp16 and bf16: the same results
// bit for bit as row-major, for any batch (the direct tiles, the 16-bit
// converted segments from 3 rows on, the threaded split), and the prefill
// conversion gives the row-major rows back exactly; a shape that does not
// pack, and int8, are refused.
TEST(LinearRowsTest, PackedEqualsRowMajorBitForBit) {
  std::mt19937 rng(23);
  ThreadPool pool(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (cpu::Isa isa : SupportedIsas()) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const int64_t size = DTypeBytes(dtype);
      for (int trial = 0; trial < 6; ++trial) {
        const int64_t rows = 1 + rng() % 40;       // past the converted segments' 32-row blocks
        const int64_t k = 8 * (1 + rng() % 100);   // past their 512 columns
        const int64_t n = 4 * (1 + rng() % 150);   // past the threaded split's 512
        const Weights w = RandomWeights(dtype, n * k, rng);
        std::vector<uint8_t> packed(w.bytes.size());
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t i = 0; i < k; ++i) {
            std::memcpy(packed.data() + cpu::PackedIndex(j, i, k) * size, w.bytes.data() + (j * k + i) * size, size);
          }
        }
        std::vector<float> a(static_cast<size_t>(rows * k));
        for (float& x : a) x = normal(rng);
        ThreadPool* threads = trial % 2 ? &pool : nullptr;
        std::vector<float> plain(static_cast<size_t>(rows * n), NAN), got(plain.size(), NAN);
        ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, w.bytes.data(), dtype, n, plain.data(), threads, isa).ok());
        cpu::WeightView view;
        view.data = packed.data();
        view.dtype = dtype;
        view.packed = true;
        ASSERT_TRUE(cpu::LinearRows(a.data(), rows, k, view, n, got.data(), threads, isa).ok());
        const std::string where =
            absl::StrFormat("%s %s rows %d k %d n %d", cpu::IsaName(isa), DTypeName(dtype), rows, k, n);
        ASSERT_EQ(std::memcmp(plain.data(), got.data(), plain.size() * sizeof(float)), 0) << where;
        // At least one row (memcmp of an empty vector's null data is UB).
        const int64_t j0 = rng() % n, j1 = j0 + 1 + rng() % (n - j0);
        std::vector<float> back(static_cast<size_t>((j1 - j0) * k), NAN);
        ASSERT_TRUE(cpu::WeightRowsToFloat(view, k, j0, j1, back.data(), threads, isa).ok());
        ASSERT_EQ(std::memcmp(back.data(), w.values.data() + j0 * k, back.size() * sizeof(float)), 0) << where;
      }
    }
  }
  std::vector<float> a(64), w(64), c(64);
  std::vector<uint16_t> scales(8, FloatToHalf(1.0f));
  cpu::WeightView view;
  view.data = w.data();
  view.packed = true;
  EXPECT_EQ(cpu::LinearRows(a.data(), 1, 8, view, 6, c.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // n not a multiple of 4
  view.scales = scales.data();
  view.block = 8;
  EXPECT_EQ(cpu::LinearRows(a.data(), 1, 8, view, 4, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::WeightRowsToFloat(view, 8, 0, 4, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LinearRowsTest, RefusesBadShapes) {
  std::vector<float> a(64), w(64), c(64);
  EXPECT_EQ(cpu::LinearRows(a.data(), 1, 12, w.data(), DType::kFloat32, 2, c.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // k not a multiple of 8
  EXPECT_EQ(cpu::LinearRows(a.data(), 1, 0, w.data(), DType::kFloat32, 2, c.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::LinearRows(a.data(), -1, 8, w.data(), DType::kFloat32, 2, c.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cpu::LinearRows(a.data(), 0, 8, w.data(), DType::kFloat32, 2, c.data(), nullptr).ok());
  // Int8 blocks must be multiples of 8 that divide k.
  std::vector<int8_t> q(64);
  std::vector<uint16_t> scales(8);
  cpu::WeightView view;
  view.data = q.data();
  view.scales = scales.data();
  for (int64_t block : {0, 12, 24, -8}) {
    view.block = block;
    EXPECT_EQ(cpu::LinearRows(a.data(), 1, 16, view, 2, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument)
        << "block " << block;
  }
  view.block = 5;
  EXPECT_EQ(cpu::WeightRowsToFloat(view, 16, 0, 1, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  // Interleaved: int8, block 32, k a multiple of 256 and n of 4 (here k 32,
  // then block 8 at 256, then n 2, then fp32).
  std::vector<int8_t> q256(4 * 256);
  std::vector<float> a256(256);
  std::vector<uint16_t> s256(4 * 8);
  view.data = q256.data();
  view.scales = s256.data();
  view.interleaved = true;
  view.block = 32;
  EXPECT_EQ(cpu::LinearRows(a256.data(), 1, 32, view, 2, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::WeightRowsToFloat(view, 32, 0, 1, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  view.block = 8;
  EXPECT_EQ(cpu::LinearRows(a256.data(), 1, 256, view, 2, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  view.block = 32;
  EXPECT_EQ(cpu::LinearRows(a256.data(), 1, 256, view, 2, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cpu::LinearRows(a256.data(), 1, 256, view, 4, c.data(), nullptr).ok());
  cpu::WeightView fp32;
  fp32.data = a256.data();
  fp32.interleaved = true;
  EXPECT_EQ(cpu::LinearRows(a256.data(), 1, 256, fp32, 1, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::WeightRowsToFloat(fp32, 256, 0, 1, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::WeightRowsToFloat(view, 16, 1, 0, c.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn
