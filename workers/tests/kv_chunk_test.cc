// A model's chunks as bytes (Model::ReadChunk / WriteChunk, the KV tiers'
// unit): random bytes written to chunks in a random order read back equal
// and touch no other chunk; bad chunk ids and sizes are refused before
// anything is copied; and a chunk saved, clobbered and restored gives a
// decode step the logits it had before.
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "workers/model/context_builder.h"
#include "workers/tests/device_sampling_model.h"
#include "workers/tests/tiny_model.h"
#include "workers/tests/random_bytes.h"

namespace chunkattn {
// Named, not anonymous: unity builds put this file beside model_test.cc.
namespace kv_chunk_test {

using testing::kTinyChunks;
using testing::kTinyChunkSize;

int64_t ChunkBytes(const LlamaModel& model) {
  return KvShapeOf(model.config(), model.layout(), model.options()).BytesPerChunk();
}

TEST(ModelChunkBytes, RandomBytesRoundTripInRandomOrder) {
  auto made = testing::MakeTinyModel();
  ASSERT_TRUE(made.ok()) << made.status();
  LlamaModel& model = **made;
  const int64_t bytes = ChunkBytes(model);
  // 2 layers x K and V x 2 KV heads x 16 tokens x head_dim 16, fp32.
  ASSERT_EQ(bytes, 2 * 2 * 2 * kTinyChunkSize * 16 * 4);
  std::mt19937_64 rng(5);
  std::vector<int32_t> order(kTinyChunks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::vector<uint8_t>> written(kTinyChunks);
  for (int32_t c : order) {
    written[c] = RandomBytes(rng, bytes);
    ASSERT_TRUE(model.WriteChunk(c, written[c]).ok());
  }
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  for (int32_t c : order) {
    ASSERT_TRUE(model.ReadChunk(c, absl::MakeSpan(out)).ok());
    ASSERT_EQ(out, written[c]) << "chunk " << c;
  }
  // Refused before anything is copied: chunks outside the pool, buffers of
  // another size.
  const std::vector<uint8_t> junk = RandomBytes(rng, bytes);
  EXPECT_EQ(model.WriteChunk(-1, junk).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.WriteChunk(kTinyChunks, junk).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.WriteChunk(3, absl::MakeConstSpan(junk).subspan(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.ReadChunk(kTinyChunks, absl::MakeSpan(out)).code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> longer(static_cast<size_t>(bytes) + 1);
  EXPECT_EQ(model.ReadChunk(3, absl::MakeSpan(longer)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(model.ReadChunk(3, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, written[3]);

  // The device stand-in forwards both.
  testing::DeviceSamplingModel device(std::move(*made));
  ASSERT_TRUE(device.WriteChunk(7, junk).ok());
  ASSERT_TRUE(device.ReadChunk(7, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, junk);
}

// A prompt over three chunks, prefilled; then one decode step's logits.
// The middle chunk saved as bytes, clobbered, and written back: the same
// decode step gives the same logits, bit for bit (and different ones while
// clobbered).
TEST(ModelChunkBytes, RestoredChunkDecodesAsBefore) {
  auto made = testing::MakeTinyModel();
  ASSERT_TRUE(made.ok()) << made.status();
  LlamaModel& model = **made;
  const int vocab = model.config().vocab_size;
  std::mt19937_64 rng(9);
  const std::vector<int32_t> path = {40, 7, 63};
  const int prompt_len = 2 * kTinyChunkSize + 9;
  ForwardBatch prefill;
  for (int i = 0; i < prompt_len; ++i) prefill.tokens.push_back(static_cast<int32_t>(rng() % vocab));
  prefill.prefill.prefix_len = {0};
  prefill.prefill.q_begin = {0, prompt_len};
  prefill.prefill.chunk_begin = {0, 3};
  prefill.prefill.chunk_ids = path;
  prefill.logits_rows = {prompt_len - 1};
  std::vector<float> logits;
  ASSERT_TRUE(model.Forward(prefill, logits).ok());

  absl::StatusOr<ChunkContext> ctx = BuildChunkContext({path}, {prompt_len + 1}, kTinyChunkSize, 1);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ForwardBatch decode;
  decode.tokens = {static_cast<int32_t>(rng() % vocab)};
  decode.decode = &*ctx;
  decode.logits_rows = {0};
  std::vector<float> before, clobbered, after;
  ASSERT_TRUE(model.Forward(decode, before).ok());
  ASSERT_EQ(before.size(), static_cast<size_t>(vocab));

  std::vector<uint8_t> saved(static_cast<size_t>(ChunkBytes(model)));
  ASSERT_TRUE(model.ReadChunk(path[1], absl::MakeSpan(saved)).ok());
  std::vector<uint8_t> noise = RandomBytes(rng, ChunkBytes(model));
  // Finite noise: small floats, so the logits change but stay comparable.
  for (size_t i = 0; i + 4 <= noise.size(); i += 4) {
    const float f = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 500;
    std::memcpy(noise.data() + i, &f, 4);
  }
  ASSERT_TRUE(model.WriteChunk(path[1], noise).ok());
  ASSERT_TRUE(model.Forward(decode, clobbered).ok());
  EXPECT_NE(clobbered, before);

  ASSERT_TRUE(model.WriteChunk(path[1], saved).ok());
  ASSERT_TRUE(model.Forward(decode, after).ok());
  EXPECT_EQ(after, before);
}

}  // namespace kv_chunk_test
}  // namespace chunkattn
