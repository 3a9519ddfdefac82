#include "kernels/cuda/rope_table.h"

#include <cmath>
#include <cstdint>

namespace chunkattn::cuda {

void FillRopeTables(const float* inv_freq, int half, int max_positions, float* cos_table, float* sin_table) {
  for (int pos = 0; pos < max_positions; ++pos) {
    float* const c = cos_table + int64_t{pos} * half;
    float* const s = sin_table + int64_t{pos} * half;
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv_freq[i];
      c[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      s[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

}  // namespace chunkattn::cuda
