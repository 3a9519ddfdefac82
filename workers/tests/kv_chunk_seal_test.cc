// A KV chunk's seal (workers/server/kv_chunk_seal.h): a sealed chunk passes
// under its key; each thing that can be wrong (a blank seal, the magic, the
// key, the length, a byte of the chunk, a buffer of another size) fails with
// its own code and a message that names it.
#include "workers/server/kv_chunk_seal.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chunkattn {
namespace {

void ExpectFails(const absl::Status& s, absl::StatusCode code, const std::string& names) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(names), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("slot 3"), absl::string_view::npos) << s;  // the caller's `where`
}

TEST(KvChunkSeal, EachCheckNamesWhatIsWrong) {
  std::vector<uint8_t> bytes(100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  absl::StatusOr<KvChunkSeal> sealed = SealKvChunk(0xAB, bytes, 100);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  const KvChunkSeal seal = *sealed;
  EXPECT_EQ(seal.magic, KvChunkSeal::kMagic);
  EXPECT_EQ(seal.length, 100u);
  EXPECT_TRUE(CheckKvChunkSeal(seal, 0xAB, 100, "slot 3").ok());
  EXPECT_TRUE(CheckKvChunkBytes(seal, bytes, "slot 3").ok());

  ExpectFails(CheckKvChunkSeal(KvChunkSeal(), 0xAB, 100, "slot 3"), absl::StatusCode::kNotFound, "never written");
  KvChunkSeal bad = seal;
  bad.magic ^= 1;
  ExpectFails(CheckKvChunkSeal(bad, 0xAB, 100, "slot 3"), absl::StatusCode::kDataLoss, "magic");
  ExpectFails(CheckKvChunkSeal(seal, 0xAC, 100, "slot 3"), absl::StatusCode::kNotFound, "key");
  ExpectFails(CheckKvChunkSeal(seal, 0xAB, 101, "slot 3"), absl::StatusCode::kDataLoss, "length");
  bytes[50] ^= 0x10;
  ExpectFails(CheckKvChunkBytes(seal, bytes, "slot 3"), absl::StatusCode::kDataLoss, "checksum");
  bytes[50] ^= 0x10;
  ExpectFails(CheckKvChunkBytes(seal, absl::MakeConstSpan(bytes).first(99), "slot 3"), absl::StatusCode::kDataLoss,
              "checksum");

  // A key of 0 is a key like any other: its seal is not blank.
  absl::StatusOr<KvChunkSeal> zero = SealKvChunk(0, bytes, 100);
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE(zero->blank());
  EXPECT_TRUE(CheckKvChunkSeal(*zero, 0, 100, "slot 3").ok());

  EXPECT_EQ(SealKvChunk(1, absl::MakeConstSpan(bytes).first(99), 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckKvChunkBuffer(99, 100, "to load into").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn
