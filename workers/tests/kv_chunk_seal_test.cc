// A KV chunk's seal (workers/server/kv_chunk_seal.h): a sealed chunk passes
// under its key; each thing that can be wrong (a blank seal, the magic, the
// key, the length, a byte of the chunk, a buffer of another size) fails with
// its own code and a message that names it.
#include "workers/server/kv_chunk_seal.h"

#include <cstdint>
#include <random>
#include <string>
#include <utility>
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

// The AVX2 and portable checksums agree on every length (whole stripes and
// tails) and alignment, and the checksum sees a flipped bit, two words
// swapped within a stripe, two stripes swapped, and the key.
TEST(KvChunkChecksum, PathsAgreeAndSeeEveryChange) {
  std::mt19937_64 rng(41);
  std::vector<uint8_t> buf((1 << 16) + 64);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = trial < 200 ? static_cast<size_t>(trial) : static_cast<size_t>(rng() % (1 << 16));
    const size_t at = rng() % 64;
    const uint64_t key = rng();
    const uint8_t* p = buf.data() + at;
    const uint64_t h = KvChunkChecksum(p, n, key);
    ASSERT_EQ(h, KvChunkChecksum(p, n, key, /*force_portable=*/true)) << n << " bytes at " << at;
    EXPECT_NE(h, KvChunkChecksum(p, n, key + 1)) << n;
    if (n == 0) continue;
    std::vector<uint8_t> v(p, p + n);
    const size_t bit = rng() % (n * 8);
    v[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(h, KvChunkChecksum(v.data(), n, key)) << "bit " << bit << " of " << n << " bytes";
    EXPECT_EQ(KvChunkChecksum(v.data(), n, key), KvChunkChecksum(v.data(), n, key, true));
    v[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    if (n >= 128) {
      // Two different stripes swapped, then two different words of one stripe.
      const size_t stripes = n / 64;
      size_t a = rng() % stripes, b = rng() % stripes;
      if (a == b) b = (a + 1) % stripes;
      if (std::equal(v.begin() + a * 64, v.begin() + a * 64 + 64, v.begin() + b * 64)) continue;
      std::swap_ranges(v.begin() + a * 64, v.begin() + a * 64 + 64, v.begin() + b * 64);
      EXPECT_NE(h, KvChunkChecksum(v.data(), n, key)) << "stripes " << a << " and " << b;
      std::swap_ranges(v.begin() + a * 64, v.begin() + a * 64 + 64, v.begin() + b * 64);
      std::swap_ranges(v.begin() + a * 64, v.begin() + a * 64 + 8, v.begin() + a * 64 + 8);
      EXPECT_NE(h, KvChunkChecksum(v.data(), n, key)) << "words 0 and 1 of stripe " << a;
    }
  }
}

}  // namespace
}  // namespace chunkattn
