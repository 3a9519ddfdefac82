// The KV tiers' map (services/core/kv_tiers.h) on seeded random walks,
// against a simulated worker that runs every step's moves on arrays of
// slots: whatever the map says a slot holds, the slot holds (so a load
// never reads another block's bytes), budgets hold, blocks leave a full
// tier least recently used first, pinned slots are never overwritten within
// their step, and a failed move forgets its block.
#include "services/core/kv_tiers.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/clock.h"
#include "gtest/gtest.h"

namespace chunkattn {
namespace {

constexpr uint64_t kEmpty = 0;  // keys are never 0 here

// Blocks belong to three namespaces.
std::string NamespaceOf(uint64_t key) { return "tenant" + std::to_string(key % 3); }

// A worker's view: what each pool chunk and tier slot holds.
struct Worker {
  std::vector<uint64_t> pool, host, disk;
  Worker(int chunks, int64_t host_slots, int64_t disk_slots)
      : pool(chunks, kEmpty), host(host_slots, kEmpty), disk(disk_slots, kEmpty) {}
  std::vector<uint64_t>& Tier(KvTier t) { return t == KvTier::kHost ? host : disk; }

  // Runs `moves` in order; a move in `fail` fails (nothing moves), as does a
  // load or demotion whose source does not hold its key. Returns the failed.
  std::vector<int32_t> Run(const std::vector<KvMove>& moves, const std::vector<bool>& fail) {
    std::vector<int32_t> failed;
    for (size_t i = 0; i < moves.size(); ++i) {
      const KvMove& m = moves[i];
      std::vector<uint64_t>& tier = Tier(m.tier);
      const bool ok = !fail[i] && (m.kind == KvMove::Kind::kStore ? pool[m.chunk] == m.key : tier[m.slot] == m.key);
      if (!ok) {
        failed.push_back(static_cast<int32_t>(i));
        if (m.kind == KvMove::Kind::kStore) tier[m.slot] = kEmpty;  // a failed write leaves nothing usable
        continue;
      }
      switch (m.kind) {
        case KvMove::Kind::kStore:
          tier[m.slot] = m.key;
          break;
        case KvMove::Kind::kLoad:
          pool[m.chunk] = m.key;
          break;
        case KvMove::Kind::kDemote:
          disk[m.to_slot] = m.key;
          break;
      }
    }
    return failed;
  }
};

// With `retention`, each block leaves the pool with random grants (a clock
// the walk moves ends them): a victim then has the lowest (priority now,
// stamp) of its tier's unpinned blocks, a dropped block a priority no higher
// than the newcomer's, and a newcomer refused a place a priority below every
// unpinned block of every tier. The model keeps each block's grants raw.
void RandomWalk(uint32_t seed, int64_t host_slots, int64_t disk_slots, double fail_rate, bool retention = false) {
  SCOPED_TRACE(testing::Message() << "seed " << seed << " host " << host_slots << " disk " << disk_slots
                                  << (retention ? " retention" : ""));
  std::mt19937 rng(seed);
  constexpr int kChunks = 12;
  ManualClock clock;
  KvTierMapOptions options{host_slots, disk_slots};
  options.clock = &clock;
  KvTierMap map(options);
  std::map<uint64_t, std::vector<RetentionGrant>> raw;  // per block in a tier
  auto priority = [&](uint64_t key) {
    int32_t p = -1;
    for (const RetentionGrant& g : raw[key]) {
      if (g.until > clock.Now()) p = std::max(p, g.priority);
    }
    return p < 0 ? kDefaultRetentionPriority : p;
  };
  int refused = 0, displaced_retained = 0;
  Worker worker(kChunks, host_slots, disk_slots);
  // When each block was last kept, refreshed, loaded or moved down: a full
  // tier's victim must have the oldest stamp of its tier's unpinned blocks.
  std::map<uint64_t, int64_t> stamp;
  int64_t now = 0;
  auto tiers_now = [&] {
    std::map<uint64_t, KvTierMap::Location> where;
    for (uint64_t k = 1; k <= 40; ++k) {
      if (auto at = map.Find(k)) where[k] = *at;
    }
    return where;
  };
  int loads = 0, demotions = 0;
  for (int step = 0; step < 400; ++step) {
    if (retention) clock.Advance(absl::Milliseconds(rng() % 700));
    std::vector<KvMove> moves;
    std::vector<bool> busy_chunk(kChunks, false);  // evicted or loaded this step
    std::vector<uint64_t> pinned;                  // blocks loaded this step
    // Evictions (a chunk's block leaves the pool) and loads (a block the
    // map holds into a new sequence's chunk), interleaved as admissions make
    // them: a request's allocations evict, then its loads are planned.
    const int ops = static_cast<int>(rng() % 5);
    for (int op = 0; op < ops; ++op) {
      if (rng() % 2 == 0) {
        const uint64_t key = 1 + rng() % 40;
        if (!map.Find(key).has_value()) continue;
        const int chunk = static_cast<int>(rng() % kChunks);
        if (busy_chunk[chunk]) continue;
        busy_chunk[chunk] = true;
        // The block's grants go to the pool with it; the tier's copy keeps none.
        const RetentionGrants back = map.Load(key, chunk, &moves);
        EXPECT_EQ(back.PriorityAt(clock.Now()), priority(key)) << "step " << step << " key " << key;
        raw[key].clear();
        pinned.push_back(key);
        stamp[key] = ++now;
        ++loads;
        continue;
      }
      const int chunk = static_cast<int>(rng() % kChunks);
      if (busy_chunk[chunk]) continue;  // the forest evicts a chunk once, and none a load targets
      busy_chunk[chunk] = true;
      const uint64_t key = 1 + rng() % 40;
      worker.pool[chunk] = key;
      RetentionGrants grants;
      std::vector<RetentionGrant> given;
      for (int g = retention ? static_cast<int>(rng() % 3) : 0; g > 0; --g) {
        RetentionGrant grant{static_cast<int32_t>(35 + rng() % 66), clock.Now() + absl::Milliseconds(1 + rng() % 20000)};
        if (rng() % 4 == 0) grant.until = absl::InfiniteFuture();
        grants.Add(grant);
        given.push_back(grant);
      }
      const auto before = tiers_now();
      if (before.count(key) == 0) raw.erase(key);
      const int32_t key_priority = [&] {
        auto& r = raw[key];
        r.insert(r.end(), given.begin(), given.end());
        return priority(key);
      }();
      map.Keep(key, chunk, &moves, &grants, NamespaceOf(key));
      const auto after = tiers_now();
      ++now;
      auto is_pinned = [&](uint64_t k) { return std::find(pinned.begin(), pinned.end(), k) != pinned.end(); };
      for (const auto& [k, at] : before) {
        auto it = after.find(k);
        if (k == key || (it != after.end() && it->second.tier == at.tier)) continue;
        // k left its tier to make room: the lowest (priority, stamp) of the unpinned blocks there.
        for (const auto& [other, other_at] : before) {
          if (other == k || other == key || other_at.tier != at.tier || is_pinned(other)) continue;
          EXPECT_LE(std::make_pair(priority(k), stamp[k]), std::make_pair(priority(other), stamp[other]))
              << "step " << step << ": " << k << " left before " << other;
        }
        if (it != after.end()) {
          ++demotions;
          stamp[k] = now;
        } else {
          EXPECT_LE(priority(k), key_priority) << "step " << step << ": " << k << " dropped for a lower block";
          displaced_retained += priority(k) > kDefaultRetentionPriority;
        }
      }
      if (after.count(key) > 0) {
        stamp[key] = now;
      } else if (before.count(key) == 0) {
        // Refused: every tier full of pinned or higher blocks.
        ++refused;
        for (const auto& [other, other_at] : before) {
          if (!is_pinned(other)) {
            EXPECT_GT(priority(other), key_priority) << "step " << step << ": refused " << key;
          }
        }
      }
    }
    // The map's claims hold where the moves read.
    std::vector<bool> fail(moves.size());
    for (size_t i = 0; i < moves.size(); ++i) fail[i] = std::uniform_real_distribution<double>(0, 1)(rng) < fail_rate;
    const std::vector<int32_t> failed = worker.Run(moves, fail);
    // Only injected failures, and the moves of the same block after one
    // (a load or demotion of a block whose store failed).
    for (size_t f = 0; f < failed.size(); ++f) {
      const int32_t i = failed[f];
      const bool after_injected = std::any_of(failed.begin(), failed.begin() + f, [&](int32_t j) {
        return fail[j] && moves[j].key == moves[i].key;
      });
      ASSERT_TRUE(fail[i] || after_injected)
          << "step " << step << ": move " << i << " read a slot that did not hold its block";
    }
    map.Complete(moves, failed);
    ASSERT_TRUE(map.CheckInvariants().ok()) << map.CheckInvariants();
    for (uint64_t key = 1; key <= 40; ++key) {
      if (auto at = map.Find(key)) {
        EXPECT_EQ(worker.Tier(at->tier)[at->slot], key) << "step " << step << " key " << key;
        EXPECT_EQ(map.Priority(key), priority(key)) << "step " << step << " key " << key;
      }
    }
    // The tenant bound's measure: the raised blocks each namespace holds.
    std::map<std::string, int64_t> raised, counted;
    for (const auto& [k, at] : tiers_now()) {
      if (priority(k) > kDefaultRetentionPriority) ++raised[NamespaceOf(k)];
    }
    for (const auto& [ns, n] : map.RaisedPerNamespace()) counted[ns] += n;
    EXPECT_EQ(counted, raised) << "step " << step;
    EXPECT_LE(map.stats().host_blocks, host_slots);
    EXPECT_LE(map.stats().disk_blocks, disk_slots);
  }
  EXPECT_GT(loads, 0);
  if (disk_slots > 0 && host_slots > 0) EXPECT_GT(demotions, 0);
  if (retention) {
    EXPECT_GT(refused + displaced_retained, 0);
  }
}

TEST(KvTierMapTest, RandomWalksAgainstASimulatedWorker) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    RandomWalk(seed, 6, 10, 0.0);  // host, then disk
    RandomWalk(seed, 5, 0, 0.0);   // host only: full means dropped
    RandomWalk(seed, 0, 7, 0.0);   // disk only
    RandomWalk(seed, 4, 6, 0.1);   // failing moves
  }
}

TEST(KvTierMapTest, RandomWalksWithRetentionAgainstASimulatedWorker) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    RandomWalk(seed, 6, 10, 0.0, true);
    RandomWalk(seed, 5, 0, 0.0, true);
    RandomWalk(seed, 0, 7, 0.0, true);
    RandomWalk(seed, 4, 6, 0.1, true);
  }
}

TEST(KvTierMapTest, OffWithoutSlotsAndPinnedSlotsAreNotReused) {
  KvTierMap off({0, 0});
  EXPECT_FALSE(off.enabled());
  std::vector<KvMove> moves;
  off.Keep(7, 0, &moves);
  EXPECT_TRUE(moves.empty());
  EXPECT_FALSE(off.Find(7).has_value());

  // One host slot, no disk: a block loaded this step keeps its slot even when
  // another block leaves the pool in the same step.
  KvTierMap map({1, 0});
  map.Keep(7, 0, &moves);
  ASSERT_EQ(moves.size(), 1u);
  map.Complete(moves, {});
  moves.clear();
  map.Load(7, 3, &moves);
  map.Keep(8, 1, &moves);  // every slot pinned: not kept
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].kind, KvMove::Kind::kLoad);
  EXPECT_FALSE(map.Find(8).has_value());
  map.Complete(moves, {});
  moves.clear();
  map.Keep(8, 1, &moves);  // unpinned now: 7 is dropped for it
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].kind, KvMove::Kind::kStore);
  EXPECT_FALSE(map.Find(7).has_value());
  EXPECT_EQ(map.stats().drops_total, 1);
  // A failed store forgets its block.
  map.Complete(moves, {0});
  EXPECT_FALSE(map.Find(8).has_value());
  EXPECT_EQ(map.stats().failed_moves_total, 1);
  EXPECT_TRUE(map.CheckInvariants().ok());
}

TEST(KvTierMapTest, BlockKeysChainEveryTokenBeforeAndTheNamespace) {
  std::vector<int32_t> a(64 * 3 + 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>(i * 7 % 1000);
  const std::vector<uint64_t> keys = BlockKeys(a, 64, "", "0");
  ASSERT_EQ(keys.size(), 3u);  // the partial block has none
  std::vector<int32_t> b = a;
  b[3] += 1;  // block 0 differs: so do the keys of every later block
  const std::vector<uint64_t> other = BlockKeys(b, 64, "", "0");
  for (int k = 0; k < 3; ++k) EXPECT_NE(keys[k], other[k]) << k;
  std::vector<int32_t> c = a;
  c[64 * 2 + 1] += 1;  // only block 2 differs
  const std::vector<uint64_t> third = BlockKeys(c, 64, "", "0");
  EXPECT_EQ(third[0], keys[0]);
  EXPECT_EQ(third[1], keys[1]);
  EXPECT_NE(third[2], keys[2]);
  // A tenant's namespace salts block 0, so every key differs: no block of
  // one tenant is ever another's hit.
  const std::vector<uint64_t> tenant = BlockKeys(a, 64, "tenant-a", "0");
  for (int k = 0; k < 3; ++k) EXPECT_NE(tenant[k], keys[k]) << k;
  EXPECT_NE(BlockKeys(a, 64, "", "1")[0], keys[0]);  // and the seed
}

}  // namespace
}  // namespace chunkattn
