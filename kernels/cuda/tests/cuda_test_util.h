// Shared by the CUDA kernel tests.
#ifndef CHUNKATTN_KERNELS_CUDA_TESTS_CUDA_TEST_UTIL_H_
#define CHUNKATTN_KERNELS_CUDA_TESTS_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <vector>

#include "kernels/api/dtype.h"

namespace chunkattn::testing {

// Values stored as `t` (raw bits) and the floats they represent.
struct Rounded {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

inline Rounded Round(DType t, const std::vector<float>& x) {
  Rounded r;
  r.bits.resize(x.size());
  r.values.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    StoreAs(t, r.bits.data(), static_cast<int64_t>(i), x[i]);
    r.values[i] = LoadAs(t, r.bits.data(), static_cast<int64_t>(i));
  }
  return r;
}

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_KERNELS_CUDA_TESTS_CUDA_TEST_UTIL_H_
