// FillRopeTables must give the CPU model's rotary operands bit for bit
// (workers/model/llama.cc computes them per step with the formula below), so
// the GPU and CPU models rotate identical fp32 values.
#include "kernels/cuda/rope_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace chunkattn::cuda {
namespace {

// Llama's base frequencies (rope_theta 500000, head_dim 128), fp32 as in
// transformers.
std::vector<float> InvFreq(int head_dim, double theta) {
  std::vector<float> inv(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(exponent)));
  }
  return inv;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(RopeTables, BitEqualToTheCpuModelsFormula) {
  const int half = 64;
  const int max_positions = 32769;  // up to position 32768, where the fp32 angle's ulp is 2^-8 rad
  const std::vector<float> inv_freq = InvFreq(2 * half, 500000.0);
  std::vector<float> cos_table(static_cast<size_t>(max_positions) * half, -7.0f);
  std::vector<float> sin_table(cos_table.size(), -7.0f);
  FillRopeTables(inv_freq.data(), half, max_positions, cos_table.data(), sin_table.data());
  for (const int pos : {0, 1, 2, 17, 4095, 8192, 30001, 32767, 32768}) {
    SCOPED_TRACE(pos);
    for (int i = 0; i < half; ++i) {
      // workers/model/llama.cc, LlamaModel::Forward.
      const float angle = static_cast<float>(pos) * inv_freq[i];
      const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
      const float s = static_cast<float>(std::sin(static_cast<double>(angle)));
      ASSERT_EQ(Bits(cos_table[static_cast<size_t>(pos) * half + i]), Bits(c)) << "i " << i;
      ASSERT_EQ(Bits(sin_table[static_cast<size_t>(pos) * half + i]), Bits(s)) << "i " << i;
    }
  }
  // Every entry is written: a rotation, so cos^2 + sin^2 == 1.
  for (size_t k = 0; k < cos_table.size(); ++k) {
    const double c = cos_table[k], s = sin_table[k];
    ASSERT_NEAR(c * c + s * s, 1.0, 1e-6) << "entry " << k;
  }
  EXPECT_EQ(cos_table[0], 1.0f);
  EXPECT_EQ(sin_table[0], 0.0f);
}

TEST(RopeTables, NoPositionsWritesNothing) {
  const std::vector<float> inv_freq = InvFreq(8, 10000.0);
  float cos_value = -7.0f, sin_value = -7.0f;
  FillRopeTables(inv_freq.data(), 4, 0, &cos_value, &sin_value);
  EXPECT_EQ(cos_value, -7.0f);
  EXPECT_EQ(sin_value, -7.0f);
}

}  // namespace
}  // namespace chunkattn::cuda
