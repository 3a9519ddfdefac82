// Shared by the CPU attention tests: output comparison, the ISAs this host
// runs, and names for (dtype, head_dim, group, chunk) parameter sweeps.
#ifndef CHUNKATTN_KERNELS_TESTS_ATTENTION_TEST_UTIL_H_
#define CHUNKATTN_KERNELS_TESTS_ATTENTION_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/sanitizer.h"
#include "kernels/cpu/attention.h"

namespace chunkattn::testing {

// Max |a - b|; NaN anywhere counts as infinite.
inline double MaxDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
  }
  return worst;
}

inline double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  return MaxDiff(a, std::vector<double>(b.begin(), b.end()));
}

// Every kernel build this host can run.
inline std::vector<cpu::Isa> Isas() {
  std::vector<cpu::Isa> isas = {cpu::Isa::kPortable};
  if (cpu::IsaSupported(cpu::Isa::kAvx2)) isas.push_back(cpu::Isa::kAvx2);
  return isas;
}

// (storage dtype, head_dim, GQA group, chunk_size)
using KernelParams = std::tuple<DType, int, int, int>;

inline std::string KernelParamName(const ::testing::TestParamInfo<KernelParams>& info) {
  return absl::StrFormat("%s_d%d_g%d_c%d", DTypeName(std::get<0>(info.param)), std::get<1>(info.param),
                         std::get<2>(info.param), std::get<3>(info.param));
}

// The decode and prefill parity sweeps: every dtype, head dims 64 and 128,
// GQA groups 1, 4 and 8, chunks of 16 and 64 tokens. Under ThreadSanitizer
// head dim 64 alone: the threads' split of the work does not depend on it,
// and the d128 half took 30 of the kernel test's 73 s there.
inline auto ParitySweep() {
  return ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                            ::testing::ValuesIn(kThreadSanitizerBuild ? std::vector<int>{64} : std::vector<int>{64, 128}),
                            ::testing::Values(1, 4, 8), ::testing::Values(16, 64));
}

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_KERNELS_TESTS_ATTENTION_TEST_UTIL_H_
