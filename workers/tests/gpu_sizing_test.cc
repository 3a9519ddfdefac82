// The CUDA model's host arithmetic and the --device flag, tested on every
// machine (the model itself needs a GPU: cuda_model_test.cc).
#include "base/device.h"
#include "gtest/gtest.h"
#include "workers/model/cuda_llama.h"

namespace chunkattn {
namespace {

TEST(GraphBucketTest, SmallestBucketHoldingTheBatch) {
  EXPECT_EQ(GraphBucket(0), 0);
  EXPECT_EQ(GraphBucket(-3), 0);
  const std::vector<std::pair<int, int>> cases = {{1, 1},   {2, 2},   {3, 4},   {4, 4},   {5, 8},
                                                  {9, 16},  {16, 16}, {17, 32}, {32, 32}, {33, 48},
                                                  {250, 256}, {256, 256}, {257, 272}};
  for (auto [n, bucket] : cases) EXPECT_EQ(GraphBucket(n), bucket) << n;
  // Every batch fits its bucket, and buckets waste less than 16 rows past 16.
  for (int n = 1; n <= 600; ++n) {
    const int b = GraphBucket(n);
    EXPECT_GE(b, n);
    if (n > 16) {
      EXPECT_LT(b - n, 16) << n;
    }
  }
}

TEST(KvChunksForMemoryTest, KeepsTheRestOfTheDeviceFree) {
  const int64_t gib = int64_t{1} << 30;
  // 80 GiB device, 60 GiB free after the weights, 90%: 52 GiB usable, less
  // 0.5 GiB reserve, in 1 MiB chunks.
  EXPECT_EQ(KvChunksForMemory(60 * gib, 80 * gib, 0.9, gib / 2, 1 << 20), (52 * 1024 - 512));
  // All of it.
  EXPECT_EQ(KvChunksForMemory(60 * gib, 80 * gib, 1.0, 0, gib), 60);
  // The weights already took more than the fraction allows.
  EXPECT_EQ(KvChunksForMemory(5 * gib, 80 * gib, 0.9, 0, 1 << 20), 0);
  // Less than one chunk.
  EXPECT_EQ(KvChunksForMemory(gib, gib, 1.0, 0, 2 * gib), 0);
  // Bad arguments give nothing rather than garbage.
  EXPECT_EQ(KvChunksForMemory(gib, gib, 0.0, 0, 1), 0);
  EXPECT_EQ(KvChunksForMemory(gib, gib, 1.5, 0, 1), 0);
  EXPECT_EQ(KvChunksForMemory(gib, gib, 0.5, 0, 0), 0);
}

TEST(ParseDeviceTest, AcceptsCpuAndCudaOrdinals) {
  auto cpu = ParseDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE(cpu->cuda);
  EXPECT_EQ(cpu->ToString(), "cpu");
  auto cuda = ParseDevice("cuda");
  ASSERT_TRUE(cuda.ok());
  EXPECT_TRUE(cuda->cuda);
  EXPECT_EQ(cuda->index, 0);
  auto three = ParseDevice("cuda:3");
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->index, 3);
  EXPECT_EQ(three->ToString(), "cuda:3");
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "cuda:01", "cuda:+1",
                          "cuda:99999", "CUDA:0", " cpu"}) {
    EXPECT_EQ(ParseDevice(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace chunkattn
