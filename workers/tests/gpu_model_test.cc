// The GPU factory (workers/model/gpu_model.h) as a build without a usable GPU
// sees it: this machine and CI have none, so a CUDA build finds no device and
// a build without CUDA says so; either way a GPU request is a clear
// FAILED_PRECONDITION, never a crash. (On a GPU host the CUDA model tests
// cover the rest.)
#include "workers/model/gpu_model.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace chunkattn {
namespace {

TEST(GpuModelFactoryTest, TheCpuIsAlwaysUsable) {
  const DeviceSpec cpu;
  EXPECT_TRUE(CheckDevice(cpu).ok());
  EXPECT_EQ(DescribeDevice(cpu), "cpu");
}

TEST(GpuModelFactoryTest, AGpuThatIsNotThereIsRefusedByName) {
  DeviceSpec gpu;
  gpu.cuda = true;
  gpu.index = 7;  // beyond any device this test runs beside
  const absl::Status status = CheckDevice(gpu);
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "cuda:7")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "CUDA")) << status;
}

TEST(GpuModelFactoryTest, WithoutCudaNoGroupIsMade) {
  if (CheckDevice(DeviceSpec{true, 0}).ok()) GTEST_SKIP() << "a GPU is visible: the CUDA model tests run instead";
  // Whether the build lacks CUDA or the host lacks a GPU, an id or a group is
  // an error; neither may hang waiting for peers.
  absl::StatusOr<std::unique_ptr<GpuGroup>> group = JoinGpuGroup(0, 2, "not an id", 0, absl::Milliseconds(200));
  EXPECT_FALSE(group.ok());
}

}  // namespace
}  // namespace chunkattn
