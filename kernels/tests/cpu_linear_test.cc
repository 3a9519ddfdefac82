// LinearRows (kernels/cpu/attention.h): the decode form of a Linear layer,
// against a float64 reference on random shapes, for each ISA and weight
// dtype, threaded and not; a row's result independent of its batch; bad
// shapes refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/api/dtype.h"
#include "kernels/cpu/attention.h"
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
        const std::string where =
            absl::StrFormat("%s %s rows %d k %d n %d", cpu::IsaName(isa), DTypeName(dtype), rows, k, n);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < n; ++j) {
            double want = 0, mag = 0;
            for (int64_t i = 0; i < k; ++i) {
              want += double{a[r * k + i]} * w.values[j * k + i];
              mag += std::fabs(double{a[r * k + i]} * w.values[j * k + i]);
            }
            // fp32 accumulation over k terms: at most k roundings of the terms' magnitude.
            ASSERT_NEAR(c[r * n + j], want, k * 6e-8 * mag + 1e-6)
                << where << " at (" << r << ", " << j << ")";
          }
        }
      }
    }
  }
}

TEST(LinearRowsTest, ARowsResultDoesNotDependOnItsBatch) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const int64_t k = 264, n = 777;
  const Weights w = RandomWeights(DType::kFloat32, n * k, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> batch(static_cast<size_t>(7 * k));
  for (float& x : batch) x = normal(rng);
  std::vector<float> all(static_cast<size_t>(7 * n));
  ASSERT_TRUE(cpu::LinearRows(batch.data(), 7, k, w.bytes.data(), DType::kFloat32, n, all.data(), &pool).ok());
  for (int64_t r = 0; r < 7; ++r) {
    std::vector<float> one(static_cast<size_t>(n));
    ASSERT_TRUE(
        cpu::LinearRows(batch.data() + r * k, 1, k, w.bytes.data(), DType::kFloat32, n, one.data(), nullptr).ok());
    EXPECT_EQ(std::memcmp(one.data(), all.data() + r * n, sizeof(float) * n), 0) << "row " << r;
  }
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
}

}  // namespace
}  // namespace chunkattn
