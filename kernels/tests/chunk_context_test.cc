#include "kernels/api/chunk_context.h"

#include "gtest/gtest.h"

namespace chunkattn {
namespace {

// Figure 2 of the ChunkAttention paper with c = 16: sequences 0, 1, 2 share
// chunks 10, 11, 12; sequence 0 then owns 13, sequence 1 owns 14 and 16,
// sequence 2 owns 15 and 17 (partially filled tails).
ChunkContext Figure2() {
  ChunkContext ctx;
  ctx.chunk_size = 16;
  ctx.seq_ids = {100, 101, 102};
  ctx.seq_len = {3 * 16 + 5, 5 * 16, 4 * 16 + 1};
  ctx.shared_chunk = {10, 11, 12};
  ctx.shared_begin = {0, 0, 0};
  ctx.shared_end = {3, 3, 3};
  ctx.shared_tokens = {16, 16, 16};
  // Sequence 1's range sits after sequence 2's, with an unused entry between.
  ctx.private_begin = {0, 4, 1};
  ctx.private_end = {1, 6, 3};
  ctx.private_chunk = {13, 15, 17, -1, 14, 16};
  ctx.private_tokens = {5, 16, 1, 0, 16, 16};
  return ctx;
}

TEST(ChunkContextTest, Figure2IsValid) {
  const ChunkContext ctx = Figure2();
  EXPECT_TRUE(ValidateChunkContext(ctx, 18).ok()) << ValidateChunkContext(ctx, 18);
  EXPECT_EQ(SequenceChunks(ctx, 0), (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(SequenceChunks(ctx, 1), (std::vector<int32_t>{10, 11, 12, 14, 16}));
  EXPECT_EQ(SequenceChunks(ctx, 2), (std::vector<int32_t>{10, 11, 12, 15, 17}));
}

TEST(ChunkContextTest, EmptyContextIsValid) {
  ChunkContext ctx;
  ctx.chunk_size = 64;
  EXPECT_TRUE(ValidateChunkContext(ctx, 1).ok());
}

// Each mutation breaks one promise; the validator must name a problem.
TEST(ChunkContextTest, RejectsEveryBrokenPromise) {
  const std::vector<std::pair<const char*, void (*)(ChunkContext&)>> cases = {
      {"bad chunk size", [](ChunkContext& c) { c.chunk_size = 24; }},
      {"seq_len size", [](ChunkContext& c) { c.seq_len.pop_back(); }},
      {"shared size", [](ChunkContext& c) { c.shared_end.pop_back(); }},
      {"range of one", [](ChunkContext& c) { c.shared_end[2] = 1; }},
      {"range past end", [](ChunkContext& c) { c.shared_end[0] = 4; }},
      {"chunk out of pool", [](ChunkContext& c) { c.private_chunk[0] = 18; }},
      {"negative chunk", [](ChunkContext& c) { c.shared_chunk[1] = -1; }},
      {"chunk twice", [](ChunkContext& c) { c.private_chunk[1] = 13; }},
      {"zero tokens", [](ChunkContext& c) { c.private_tokens[0] = 0; }},
      {"too many tokens", [](ChunkContext& c) { c.shared_tokens[0] = 17; }},
      {"partial shared chunk mid-path", [](ChunkContext& c) { c.shared_tokens[1] = 8; }},
      {"partial private chunk mid-path", [](ChunkContext& c) { c.private_tokens[4] = 3; }},
      {"seq_len disagrees", [](ChunkContext& c) { c.seq_len[0] += 1; }},
      {"overlapping ranges", [](ChunkContext& c) { c.private_begin[1] = 2; }},
      {"range outside table", [](ChunkContext& c) { c.private_end[1] = 7; }},
      {"inverted range", [](ChunkContext& c) { c.private_end[0] = -1; }},
      {"chunk at two depths",
       [](ChunkContext& c) {
         // Sequences 1 and 2 reach chunk 12 after different numbers of chunks.
         c.shared_begin = {0, 0, 1};
         c.shared_end = {3, 2, 3};
       }},
      {"sequence without chunks",
       [](ChunkContext& c) {
         c.seq_ids.push_back(103);
         c.seq_len.push_back(0);
         c.private_begin.push_back(3);
         c.private_end.push_back(3);
       }},
  };
  for (const auto& [name, mutate] : cases) {
    ChunkContext ctx = Figure2();
    mutate(ctx);
    const absl::Status s = ValidateChunkContext(ctx, 18);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << ": " << s;
  }
}

}  // namespace
}  // namespace chunkattn
