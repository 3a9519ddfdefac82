#include "kernels/cuda/device.h"

#include "gtest/gtest.h"

namespace chunkattn::cuda {
namespace {

TEST(CudaDeviceTest, DescribesEveryVisibleDevice) {
  const int n = DeviceCount();
  if (n == 0) GTEST_SKIP() << "no CUDA device on this machine";
  for (int d = 0; d < n; ++d) {
    const std::string desc = DeviceDescription(d);
    EXPECT_NE(desc.find("sm_"), std::string::npos) << desc;
  }
  EXPECT_NE(DeviceDescription(n).find("cudaGetDeviceProperties"), std::string::npos);
}

}  // namespace
}  // namespace chunkattn::cuda
