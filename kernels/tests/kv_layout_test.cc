#include "kernels/api/kv_layout.h"

#include "gtest/gtest.h"

namespace chunkattn {
namespace {

// A Llama-2-7B-shaped pool in fp16: 32 layers, 32 KV heads of 128.
constexpr KvGeometry kLlama7b{32, 32, 64, 128, DType::kFloat16};
static_assert(kLlama7b.BytesPerToken() == 32 * 2 * 32 * 128 * 2);
static_assert(kLlama7b.BytesPerChunk() == int64_t{64} * 512 * 1024);

TEST(KvLayoutTest, ChunkSizesArePowersOfTwoIn16To256) {
  for (int c = 0; c <= 512; ++c) {
    const bool want = c == 16 || c == 32 || c == 64 || c == 128 || c == 256;
    EXPECT_EQ(IsValidChunkSize(c), want) << c;
  }
}

TEST(KvLayoutTest, OffsetsAreDenseAndRowMajor) {
  const KvGeometry g{2, 3, 16, 8, DType::kFloat16};
  int64_t expected = 0;
  for (int chunk = 0; chunk < 4; ++chunk)
    for (int head = 0; head < g.num_kv_heads; ++head)
      for (int slot = 0; slot < g.chunk_size; ++slot)
        for (int dim = 0; dim < g.head_dim; ++dim) ASSERT_EQ(g.Offset(chunk, head, slot, dim), expected++);
  EXPECT_EQ(g.ChunkElementsPerLayer(), 3 * 16 * 8);
}

TEST(KvLayoutTest, BudgetGivesWholeChunks) {
  EXPECT_EQ(ChunksForBudget(kLlama7b, int64_t{40} << 30), 1280);  // 40 GiB / 32 MiB
  EXPECT_EQ(ChunksForBudget(kLlama7b, kLlama7b.BytesPerChunk() - 1), 0);
  EXPECT_EQ(ChunksForBudget(kLlama7b, -5), 0);
  KvGeometry bad = kLlama7b;
  bad.chunk_size = 48;
  EXPECT_FALSE(bad.IsValid());
  EXPECT_EQ(ChunksForBudget(bad, int64_t{1} << 40), 0);
  bad = kLlama7b;
  bad.dtype = static_cast<DType>(7);
  EXPECT_FALSE(bad.IsValid());
  bad = kLlama7b;
  bad.num_layers = 1 << 30;  // would overflow the byte count
  EXPECT_FALSE(bad.IsValid());
  EXPECT_EQ(ChunksForBudget(bad, int64_t{1} << 40), 0);
}

}  // namespace
}  // namespace chunkattn
