#include "kernels/cuda/device.h"

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"

namespace chunkattn::cuda {
namespace {

TEST(CudaDeviceTest, DescribesEveryVisibleDevice) {
  const int n = DeviceCount();
  if (n == 0) GTEST_SKIP() << "no CUDA device on this machine";
  for (int d = 0; d < n; ++d) {
    const std::string desc = DeviceDescription(d);
    EXPECT_NE(desc.find("sm_"), std::string::npos) << desc;
  }
}

// A failed call is reported once, where it happens: it leaves nothing in the
// thread's last-error slot for the next launch's cudaGetLastError() to blame
// on that launch. Needs a driver: without one the runtime fails to start and
// every call, cudaGetLastError included, reports that for good
// (cuda_errors_test checks the same logic against a stand-in runtime).
TEST(CudaDeviceTest, FailedCallsLeaveNoLastErrorBehind) {
  const int n = DeviceCount();
  if (n == 0) GTEST_SKIP() << "no CUDA device on this machine";
  ASSERT_EQ(cudaPeekAtLastError(), cudaSuccess);
  for (int bad : {-1, n}) {
    EXPECT_NE(DeviceDescription(bad).find("cudaGetDeviceProperties"), std::string::npos);
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "after DeviceDescription(" << bad << ")";
  }
  const absl::Status set = CudaStatus(cudaSetDevice(n), "cudaSetDevice(n)");
  EXPECT_EQ(set.code(), absl::StatusCode::kInternal);
  EXPECT_NE(set.message().find("cudaSetDevice(n)"), std::string::npos) << set;
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);

  void* p = nullptr;
  const absl::Status huge = CudaStatus(cudaMalloc(&p, size_t{1} << 60), "cudaMalloc");
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted) << huge;
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_TRUE(CudaStatus(cudaSuccess, "nothing").ok());
}

}  // namespace
}  // namespace chunkattn::cuda
