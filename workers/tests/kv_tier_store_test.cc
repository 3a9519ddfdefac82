// The worker's KV tiers (workers/server/kv_tier_store.h): random bytes
// survive store / load / demote in random slot orders, and a load hands back
// nothing but what was stored under its key: a wrong key, a slot never
// written, a byte flipped in the disk file and a truncated file all fail
// cleanly. Budgets give their slot counts; bad flags are refused by name.
#include "workers/server/kv_tier_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "gtest/gtest.h"
#include "base/tests/temp_dir.h"
#include "workers/tests/random_bytes.h"

namespace chunkattn {
namespace {

KvTierOptions Options(int64_t host_slots, const std::string& dir, int64_t disk_slots, int64_t chunk_bytes) {
  const int64_t slot = KvTierStore::kHeaderBytes + chunk_bytes;
  KvTierOptions o;
  o.host_bytes = host_slots * slot + slot / 2;  // a part slot holds nothing
  o.disk_dir = dir;
  o.disk_bytes = disk_slots * slot + slot - 1;
  return o;
}

TEST(KvTierStore, BudgetsGiveTheirSlotCounts) {
  const std::string dir = testing::MakeTempDir("kv-tier-test");
  ASSERT_FALSE(dir.empty());
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20; ++i) {
    const int64_t chunk = 1 + static_cast<int64_t>(rng() % 100000);
    const int64_t host = static_cast<int64_t>(rng() % 50), disk = static_cast<int64_t>(rng() % 50);
    auto store = KvTierStore::Create(Options(host, dir, disk, chunk), chunk);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->slots(KvTier::kHost), host);
    EXPECT_EQ((*store)->slots(KvTier::kDisk), disk);
    EXPECT_EQ((*store)->chunk_bytes(), chunk);
    EXPECT_EQ((*store)->disk_path().empty(), disk == 0);
  }
  // Off: no budget, no directory.
  auto off = KvTierStore::Create(KvTierOptions(), 4096);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->slots(KvTier::kHost), 0);
  EXPECT_EQ((*off)->slots(KvTier::kDisk), 0);
  std::vector<uint8_t> bytes(4096);
  EXPECT_EQ((*off)->Store(KvTier::kHost, 0, 1, bytes).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*off)->Load(KvTier::kDisk, 0, 1, absl::MakeSpan(bytes)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(KvTierStore::Create(KvTierOptions(), 0).ok());
}

// A seeded random walk over both tiers against a map of what each slot
// holds: every load of a written slot under its key returns its bytes, under
// another key or of a slot never written fails, and a demote carries key and
// bytes down.
TEST(KvTierStore, RandomWalkRoundTrips) {
  const std::string dir = testing::MakeTempDir("kv-tier-test");
  ASSERT_FALSE(dir.empty());
  for (uint64_t seed = 0; seed < 4; ++seed) {
    std::mt19937_64 rng(seed);
    const int64_t chunk = 1 + static_cast<int64_t>(rng() % 6000);  // odd sizes: the hash's tail too
    const int64_t host = 1 + static_cast<int64_t>(rng() % 8), disk = 1 + static_cast<int64_t>(rng() % 8);
    auto made = KvTierStore::Create(Options(host, dir, disk, chunk), chunk);
    ASSERT_TRUE(made.ok()) << made.status();
    KvTierStore& store = **made;
    std::map<std::pair<KvTier, int64_t>, std::pair<uint64_t, std::vector<uint8_t>>> held;
    std::vector<uint8_t> out(static_cast<size_t>(chunk));
    for (int step = 0; step < 400; ++step) {
      const KvTier tier = rng() % 2 ? KvTier::kHost : KvTier::kDisk;
      const int64_t slot = static_cast<int64_t>(rng() % static_cast<uint64_t>(store.slots(tier)));
      const auto it = held.find({tier, slot});
      switch (rng() % 4) {
        case 0: {  // store
          const uint64_t key = rng();
          std::vector<uint8_t> bytes = RandomBytes(rng, chunk);
          ASSERT_TRUE(store.Store(tier, slot, key, bytes).ok());
          held[{tier, slot}] = {key, std::move(bytes)};
          break;
        }
        case 1:  // load under its key
          if (it == held.end()) {
            EXPECT_EQ(store.Load(tier, slot, rng(), absl::MakeSpan(out)).code(), absl::StatusCode::kNotFound);
          } else {
            ASSERT_TRUE(store.Load(tier, slot, it->second.first, absl::MakeSpan(out)).ok());
            ASSERT_EQ(out, it->second.second);
          }
          break;
        case 2:  // load under another key
          if (it != held.end()) {
            EXPECT_EQ(store.Load(tier, slot, it->second.first ^ (uint64_t{1} << (rng() % 64)), absl::MakeSpan(out))
                          .code(),
                      absl::StatusCode::kNotFound);
          }
          break;
        default: {  // demote a host slot to a disk slot
          const int64_t from = static_cast<int64_t>(rng() % static_cast<uint64_t>(host));
          const int64_t to = static_cast<int64_t>(rng() % static_cast<uint64_t>(disk));
          const auto src = held.find({KvTier::kHost, from});
          const absl::Status demoted = store.Demote(from, to);
          if (src == held.end()) {
            EXPECT_EQ(demoted.code(), absl::StatusCode::kNotFound);
          } else {
            ASSERT_TRUE(demoted.ok()) << demoted;
            held[{KvTier::kDisk, to}] = src->second;
          }
          break;
        }
      }
    }
    // Everything still held reads back.
    for (const auto& [where, value] : held) {
      ASSERT_TRUE(store.Load(where.first, where.second, value.first, absl::MakeSpan(out)).ok());
      ASSERT_EQ(out, value.second);
    }
  }
}

TEST(KvTierStore, RefusesBadSlotsAndBuffers) {
  auto made = KvTierStore::Create(Options(2, "", 0, 100), 100);
  ASSERT_TRUE(made.ok());
  KvTierStore& store = **made;
  std::vector<uint8_t> bytes(100), short_bytes(99);
  EXPECT_EQ(store.Store(KvTier::kHost, 2, 1, bytes).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store.Store(KvTier::kHost, -1, 1, bytes).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store.Store(KvTier::kDisk, 0, 1, bytes).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store.Store(KvTier::kHost, 0, 1, short_bytes).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Store(KvTier::kHost, 0, 1, bytes).ok());
  EXPECT_EQ(store.Load(KvTier::kHost, 0, 1, absl::MakeSpan(short_bytes)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Demote(0, 0).code(), absl::StatusCode::kOutOfRange);  // no disk tier
  // A key of 0 is a key like any other, not "never written".
  ASSERT_TRUE(store.Store(KvTier::kHost, 1, 0, bytes).ok());
  EXPECT_TRUE(store.Load(KvTier::kHost, 1, 0, absl::MakeSpan(bytes)).ok());
}

// The disk tier's file: private to its owner, one per store, gone with it.
TEST(KvTierStore, DiskFileIsPrivateAndRemoved) {
  const std::string dir = testing::MakeTempDir("kv-tier-test");
  ASSERT_FALSE(dir.empty());
  std::string first_path;
  {
    auto a = KvTierStore::Create(Options(0, dir, 3, 64), 64);
    auto b = KvTierStore::Create(Options(0, dir, 3, 64), 64);
    ASSERT_TRUE(a.ok() && b.ok());
    first_path = (*a)->disk_path();
    EXPECT_NE(first_path, (*b)->disk_path());
    struct stat st;
    ASSERT_EQ(::stat(first_path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600);
    EXPECT_EQ(st.st_size, 3 * (KvTierStore::kHeaderBytes + 64));
  }
  EXPECT_FALSE(std::filesystem::exists(first_path));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

// Any byte of a stored slot changed on disk (header or chunk) fails its load;
// the other slots still load.
TEST(KvTierStore, CorruptDiskBytesFailTheLoad) {
  const std::string dir = testing::MakeTempDir("kv-tier-test");
  ASSERT_FALSE(dir.empty());
  std::mt19937_64 rng(41);
  const int64_t chunk = 777, slot_bytes = KvTierStore::kHeaderBytes + chunk;
  auto made = KvTierStore::Create(Options(0, dir, 4, chunk), chunk);
  ASSERT_TRUE(made.ok());
  KvTierStore& store = **made;
  std::vector<std::vector<uint8_t>> bytes;
  for (int64_t s = 0; s < 4; ++s) {
    bytes.push_back(RandomBytes(rng, chunk));
    ASSERT_TRUE(store.Store(KvTier::kDisk, s, 100 + s, bytes.back()).ok());
  }
  const int fd = ::open(store.disk_path().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> out(static_cast<size_t>(chunk));
  for (int i = 0; i < 60; ++i) {
    const int64_t slot = static_cast<int64_t>(rng() % 4);
    // The seal's bytes in a third of the cases, else the chunk's.
    const int64_t at = rng() % 3 == 0 ? static_cast<int64_t>(rng() % KvTierStore::kHeaderBytes)
                                      : KvTierStore::kHeaderBytes + static_cast<int64_t>(rng() % chunk);
    const off_t offset = static_cast<off_t>(slot * slot_bytes + at);
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, offset), 1);
    const uint8_t flipped = static_cast<uint8_t>(b ^ (1u << (rng() % 8)));
    ASSERT_EQ(::pwrite(fd, &flipped, 1, offset), 1);
    const absl::Status loaded = store.Load(KvTier::kDisk, slot, 100 + slot, absl::MakeSpan(out));
    EXPECT_FALSE(loaded.ok()) << "byte " << at << " of slot " << slot;
    EXPECT_TRUE(loaded.code() == absl::StatusCode::kDataLoss || loaded.code() == absl::StatusCode::kNotFound)
        << loaded;
    ASSERT_EQ(::pwrite(fd, &b, 1, offset), 1);  // restored: it loads again
    ASSERT_TRUE(store.Load(KvTier::kDisk, slot, 100 + slot, absl::MakeSpan(out)).ok());
    ASSERT_EQ(out, bytes[slot]);
  }
  // A file cut short in slot 2: slots 2 and 3 fail, 0 and 1 still load.
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(2 * slot_bytes + KvTierStore::kHeaderBytes + chunk / 2)), 0);
  ::close(fd);
  for (int64_t s = 0; s < 4; ++s) {
    const absl::Status loaded = store.Load(KvTier::kDisk, s, 100 + s, absl::MakeSpan(out));
    if (s < 2) {
      ASSERT_TRUE(loaded.ok()) << loaded;
      EXPECT_EQ(out, bytes[s]);
    } else {
      EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
    }
  }
  // A store writes the slot whole again.
  ASSERT_TRUE(store.Store(KvTier::kDisk, 3, 7, bytes[0]).ok());
  ASSERT_TRUE(store.Load(KvTier::kDisk, 3, 7, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, bytes[0]);
}

// The worker's allocator gives the host tier and the disk tier's staging
// chunk (pinned memory on a GPU): each allocation is released with the
// store, and a refused one fails Create. StoreFrom fills the slot in place;
// a fill that fails leaves a host slot blank, whatever it held; LoadTo hands
// the consumer the checked bytes, and its error is the load's.
TEST(KvTierStore, AllocatorAndInPlaceMoves) {
  const std::string dir = testing::MakeTempDir("kv-tier-test");
  ASSERT_FALSE(dir.empty());
  static int live = 0;
  int calls = 0;
  HostAllocator counting = [&calls](int64_t bytes) -> absl::StatusOr<HostBytes> {
    ++calls;
    ASSIGN_OR_RETURN(HostBytes b, AllocateHostBytes(bytes));
    ++live;
    return HostBytes(b.release(), [](uint8_t* p) {
      --live;
      std::free(p);
    });
  };
  constexpr int64_t kChunk = 1000;
  {
    auto made = KvTierStore::Create(Options(3, dir, 2, kChunk), kChunk, counting);
    ASSERT_TRUE(made.ok()) << made.status();
    KvTierStore& store = **made;
    EXPECT_EQ(calls, 2);  // the host slots, the staging chunk
    EXPECT_EQ(live, 2);
    std::mt19937_64 rng(3);
    for (KvTier tier : {KvTier::kHost, KvTier::kDisk}) {
      const std::vector<uint8_t> want = RandomBytes(rng, kChunk);
      ASSERT_TRUE(store.StoreFrom(tier, 1, 77, [&](absl::Span<uint8_t> chunk) {
                         EXPECT_EQ(chunk.size(), static_cast<size_t>(kChunk));
                         std::copy(want.begin(), want.end(), chunk.begin());
                         return absl::OkStatus();
                       }).ok());
      std::vector<uint8_t> got;
      ASSERT_TRUE(store.LoadTo(tier, 1, 77, [&](absl::Span<const uint8_t> chunk) {
                         got.assign(chunk.begin(), chunk.end());
                         return absl::OkStatus();
                       }).ok());
      EXPECT_EQ(got, want);
      // The consumer's error is the load's.
      EXPECT_EQ(store.LoadTo(tier, 1, 77, [](absl::Span<const uint8_t>) { return absl::AbortedError("no"); }).code(),
                absl::StatusCode::kAborted);
      // A failed fill: the host slot that held 77 is blank; the disk slot
      // keeps it (the staging chunk never reached the file).
      EXPECT_EQ(store.StoreFrom(tier, 1, 78, [](absl::Span<uint8_t> chunk) {
                       chunk[0] ^= 1;  // half written
                       return absl::UnavailableError("device copy failed");
                     }).code(),
                absl::StatusCode::kUnavailable);
      std::vector<uint8_t> out(kChunk);
      EXPECT_EQ(store.Load(tier, 1, 77, absl::MakeSpan(out)).ok(), tier == KvTier::kDisk);
      EXPECT_FALSE(store.Load(tier, 1, 78, absl::MakeSpan(out)).ok());
    }
  }
  EXPECT_EQ(live, 0);
  HostAllocator refuse = [](int64_t) -> absl::StatusOr<HostBytes> { return absl::ResourceExhaustedError("pinned"); };
  EXPECT_EQ(KvTierStore::Create(Options(3, "", 0, kChunk), kChunk, refuse).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(KvTierStore::Create(Options(0, dir, 3, kChunk), kChunk, refuse).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(KvTierStore::Create(KvTierOptions(), kChunk, refuse).ok());  // no tier: nothing allocated
}

TEST(KvTierStore, FlagsAreChecked) {
  const std::string dir = testing::MakeTempDir("kv-tier-test");
  ASSERT_FALSE(dir.empty());
  auto ok = KvTierOptionsFromFlags(64, dir, 128);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->host_bytes, int64_t{64} << 20);
  EXPECT_EQ(ok->disk_dir, dir);
  EXPECT_EQ(ok->disk_bytes, int64_t{128} << 20);
  auto off = KvTierOptionsFromFlags(0, "", 0);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->host_bytes, 0);
  EXPECT_TRUE(off->disk_dir.empty());

  auto refused = [](int64_t host, const std::string& d, int64_t disk, const std::string& flag) {
    auto r = KvTierOptionsFromFlags(host, d, disk);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << host << " " << d << " " << disk;
    EXPECT_NE(r.status().message().find(flag), absl::string_view::npos) << r.status();
  };
  refused(-1, "", 0, "--host_kv_cache_mib");
  refused((int64_t{1} << 30) + 1, "", 0, "--host_kv_cache_mib");
  refused(0, dir, -5, "--disk_kv_cache_mib");
  refused(0, "", 10, "--disk_kv_cache_dir");             // a budget without a directory
  refused(0, dir, 0, "--disk_kv_cache_mib");      // a directory without a budget
  refused(0, dir + "/missing", 10, "--disk_kv_cache_dir");
  const std::string file = dir + "/a-file";
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  refused(0, file, 10, "--disk_kv_cache_dir");
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string ro = dir + "/read-only";
    ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
    refused(0, ro, 10, "--disk_kv_cache_dir");
  }
}

}  // namespace
}  // namespace chunkattn
