#include "services/core/chunk_allocator.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace chunkattn {
namespace {

TEST(ChunkAllocatorTest, HandsOutEveryIdOnceThenExhausts) {
  ChunkAllocator a(5);
  std::vector<ChunkId> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = a.Allocate();
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<ChunkId>{0, 1, 2, 3, 4}));
  EXPECT_EQ(a.num_free(), 0);
  const auto none = a.Allocate();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("all 5 chunks"), std::string::npos) << none.status();
}

TEST(ChunkAllocatorTest, FreedIdIsReusedFirst) {
  ChunkAllocator a(4);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a.Allocate().ok());
  ASSERT_TRUE(a.Free(1).ok());
  EXPECT_FALSE(a.IsAllocated(1));
  EXPECT_EQ(*a.Allocate(), 1);
  EXPECT_EQ(a.num_allocated(), 3);
}

TEST(ChunkAllocatorTest, RejectsDoubleAndOutOfRangeFree) {
  ChunkAllocator a(2);
  ASSERT_TRUE(a.Allocate().ok());
  EXPECT_EQ(a.Free(1).code(), absl::StatusCode::kFailedPrecondition);  // never handed out
  EXPECT_EQ(a.Free(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.Free(-1).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.Free(0).ok());
  EXPECT_EQ(a.Free(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.num_free(), 2);
}

TEST(ChunkAllocatorTest, SizedFromBudget) {
  const KvGeometry g{2, 4, 16, 64, DType::kFloat16};  // 2 * 2 * 4 * 16 * 64 * 2 = 32 KiB per chunk
  auto a = ChunkAllocator::FromBudget(g, 1 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->capacity(), 32);
  EXPECT_EQ(ChunkAllocator::FromBudget(g, 1000).status().code(), absl::StatusCode::kInvalidArgument);
  KvGeometry bad = g;
  bad.chunk_size = 100;
  EXPECT_EQ(ChunkAllocator::FromBudget(bad, 1 << 30).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn
