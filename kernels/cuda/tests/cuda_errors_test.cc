// Error reporting of the CUDA host code against a stand-in runtime
// (fake_cudart.h): a failed call is reported once, where it happens, and
// leaves the thread's last-error slot clear, so the next launch's
// cudaGetLastError() does not blame that launch for it. The same property
// against the real runtime is device_test's, on a GPU.
#include <cuda_runtime_api.h>

#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/tests/fake_cudart.h"

namespace chunkattn::cuda {
namespace {

using testing::FakeFailedCall;
using testing::SetFakeDeviceCount;

// What a kernel launch reports: the slot, as a launcher's cudaGetLastError().
cudaError_t NextLaunch() { return cudaGetLastError(); }

TEST(CudaErrorsTest, TheStandInKeepsTheRuntimesLastError) {
  ASSERT_EQ(FakeFailedCall(cudaErrorInvalidValue), cudaErrorInvalidValue);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(NextLaunch(), cudaErrorInvalidValue) << "an unreported error is blamed on the next launch";
  EXPECT_EQ(NextLaunch(), cudaSuccess);
}

TEST(CudaErrorsTest, DeviceQueriesClearWhatTheyReport) {
  for (int n : {0, 2}) {
    SetFakeDeviceCount(n);
    EXPECT_EQ(DeviceCount(), n);
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << n << " devices";
    for (int bad : {-1, n}) {
      EXPECT_EQ(DeviceDescription(bad), "cudaGetDeviceProperties: fake error");
      EXPECT_EQ(NextLaunch(), cudaSuccess) << "after DeviceDescription(" << bad << ") of " << n;
    }
  }
  SetFakeDeviceCount(1);
  EXPECT_EQ(DeviceDescription(0), "Fake GPU, sm_90, 132 SMs, 80.0 GiB");
  SetFakeDeviceCount(0);
}

TEST(CudaErrorsTest, CudaStatusReportsAndClears) {
  const absl::Status failed = CudaStatus(FakeFailedCall(cudaErrorInvalidDevice), "cudaSetDevice(7)");
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(failed.message(), "cudaSetDevice(7): cudaErrorFake (fake error)");
  EXPECT_EQ(NextLaunch(), cudaSuccess);

  const absl::Status oom = CudaStatus(FakeFailedCall(cudaErrorMemoryAllocation), "cudaMalloc of 1 bytes");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(NextLaunch(), cudaSuccess);

  EXPECT_TRUE(CudaStatus(cudaSuccess, "nothing").ok());
}

// CUDA_RETURN_IF_ERROR is CudaStatus: a function that returns early on a
// failed call leaves the slot clear too.
absl::Status TwoCalls(cudaError_t first) {
  CUDA_RETURN_IF_ERROR(FakeFailedCall(first));
  return absl::OkStatus();
}

TEST(CudaErrorsTest, ReturnIfErrorClears) {
  EXPECT_EQ(TwoCalls(cudaErrorLaunchFailure).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(NextLaunch(), cudaSuccess);
  EXPECT_TRUE(TwoCalls(cudaSuccess).ok());
}

}  // namespace
}  // namespace chunkattn::cuda
