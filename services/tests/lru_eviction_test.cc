// LruEviction alone (against a list model), then its age through the forest.
#include "services/core/lru_eviction.h"

#include <algorithm>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "gtest/gtest.h"
#include "services/core/prefix_forest.h"

namespace chunkattn {
namespace {

TEST(LruEvictionTest, VictimIsTheLeastRecentlyCachedAndAgesFollowTheClock) {
  ManualClock clock;
  LruEviction lru(8, &clock);
  EXPECT_EQ(lru.Victim(), LruEviction::kNone);
  EXPECT_EQ(lru.OldestAge(), absl::ZeroDuration());
  lru.Cached(5);
  clock.Advance(absl::Seconds(3));
  lru.Cached(2);
  lru.Cached(7);
  EXPECT_EQ(lru.Victim(), 5);
  EXPECT_EQ(lru.OldestAge(), absl::Seconds(3));
  lru.Uncached(5);  // reused: 2 is next, cached 0 s ago
  EXPECT_EQ(lru.Victim(), 2);
  EXPECT_EQ(lru.OldestAge(), absl::ZeroDuration());
  clock.Advance(absl::Seconds(10));
  lru.Cached(5);  // cached again: now the most recent
  lru.Uncached(2);
  lru.Uncached(7);
  EXPECT_EQ(lru.Victim(), 5);
  EXPECT_EQ(lru.OldestAge(), absl::ZeroDuration());
  EXPECT_EQ(lru.size(), 1);
}

TEST(LruEvictionTest, RandomCallsMatchAListModel) {
  constexpr int kCapacity = 64;
  ManualClock clock;
  LruEviction lru(kCapacity, &clock);
  std::list<int32_t> model;  // front: the victim
  std::vector<absl::Time> since(kCapacity);
  absl::BitGen gen(std::seed_seq{20261124});
  for (int step = 0; step < 20000; ++step) {
    clock.Advance(absl::Milliseconds(absl::Uniform(gen, 0, 5)));
    const int32_t id = absl::Uniform(gen, 0, kCapacity);
    const bool cached = std::find(model.begin(), model.end(), id) != model.end();
    ASSERT_EQ(lru.contains(id), cached);
    if (cached) {
      lru.Uncached(id);
      model.remove(id);
    } else {
      lru.Cached(id);
      model.push_back(id);
      since[id] = clock.Now();
    }
    ASSERT_EQ(lru.size(), static_cast<int32_t>(model.size()));
    ASSERT_EQ(lru.Victim(), model.empty() ? LruEviction::kNone : model.front());
    ASSERT_EQ(lru.OldestAge(), model.empty() ? absl::ZeroDuration() : clock.Now() - since[model.front()]);
    // The whole order, both ways, every so often.
    if (step % 97 == 0) {
      std::vector<int32_t> forward;
      for (int32_t k = lru.Victim(); k != LruEviction::kNone; k = lru.Next(k)) forward.push_back(k);
      ASSERT_EQ(forward, std::vector<int32_t>(model.begin(), model.end()));
      int32_t last = model.empty() ? LruEviction::kNone : model.back();
      std::vector<int32_t> backward;
      for (int32_t k = last; k != LruEviction::kNone; k = lru.Prev(k)) backward.push_back(k);
      ASSERT_EQ(backward, std::vector<int32_t>(model.rbegin(), model.rend()));
    }
  }
}

// The reduced grant set against every grant kept raw: the same priority at
// every time, however grants arrive and end.
TEST(RetentionGrantsTest, PriorityIsTheHighestRunningGrantAtEveryTime) {
  absl::BitGen gen(std::seed_seq{41});
  for (int round = 0; round < 500; ++round) {
    RetentionGrants grants;
    std::vector<RetentionGrant> raw;
    const absl::Time t0 = absl::UnixEpoch();
    for (int k = absl::Uniform(gen, 0, 8); k > 0; --k) {
      RetentionGrant g{absl::Uniform(gen, 35, 101),
                       absl::Uniform(gen, 0, 4) == 0 ? absl::InfiniteFuture()
                                                      : t0 + absl::Seconds(absl::Uniform(gen, 1, 30))};
      grants.Add(g);
      raw.push_back(g);
    }
    ASSERT_LE(grants.grants().size(), raw.size());
    absl::Time now = t0;
    for (int s = 0; s < 40; ++s, now += absl::Seconds(1)) {
      int32_t want = -1;
      for (const RetentionGrant& g : raw) {
        if (g.until > now) want = std::max(want, g.priority);
      }
      if (want < 0) want = kDefaultRetentionPriority;
      ASSERT_EQ(grants.PriorityAt(now), want) << "round " << round << " at " << s << " s";
      if (absl::Uniform(gen, 0, 2) == 0) grants.Expire(now);  // forgetting what ended changes nothing
      ASSERT_EQ(grants.PriorityAt(now), want);
    }
  }
}

// Priorities, grants and their ends against a brute-force model: cached ids
// sorted by (priority now, when cached).
TEST(LruEvictionTest, PriorityThenRecencyMatchesASortedModel) {
  constexpr int kCapacity = 48;
  ManualClock clock;
  LruEviction lru(kCapacity, &clock);
  std::vector<std::vector<RetentionGrant>> raw(kCapacity);
  std::vector<int64_t> stamp(kCapacity, -1);  // -1: not cached
  int64_t next = 0;
  auto priority = [&](int id) {
    int32_t p = -1;
    for (const RetentionGrant& g : raw[id]) {
      if (g.until > clock.Now()) p = std::max(p, g.priority);
    }
    return p < 0 ? kDefaultRetentionPriority : p;
  };
  absl::BitGen gen(std::seed_seq{20261201});
  int changes = 0;
  for (int step = 0; step < 20000; ++step) {
    clock.Advance(absl::Milliseconds(absl::Uniform(gen, 0, 400)));
    lru.Expire(clock.Now(), [&](int64_t id, int32_t from, int32_t to) {
      ++changes;
      EXPECT_NE(from, to);
      EXPECT_EQ(to, priority(static_cast<int>(id)));
    });
    const int id = absl::Uniform(gen, 0, kCapacity);
    const int op = absl::Uniform(gen, 0, 10);
    if (op < 3) {
      RetentionGrant g{absl::Uniform(gen, 35, 101), clock.Now() + absl::Milliseconds(absl::Uniform(gen, 1, 8000))};
      if (absl::Uniform(gen, 0, 5) == 0) g.until = absl::InfiniteFuture();
      const int32_t before = priority(id);
      raw[id].push_back(g);
      ASSERT_EQ(lru.Grant(id, g, clock.Now()), before);
    } else if (stamp[id] >= 0) {
      lru.Uncached(id);
      stamp[id] = -1;
      if (op < 5) {  // freed: its grants go
        lru.ClearGrants(id);
        raw[id].clear();
      }
    } else {
      lru.Cached(id);
      stamp[id] = next++;
    }
    std::vector<std::pair<std::pair<int32_t, int64_t>, int>> model;
    for (int k = 0; k < kCapacity; ++k) {
      ASSERT_EQ(lru.Priority(k), priority(k)) << "step " << step << " id " << k;
      if (stamp[k] >= 0) model.push_back({{priority(k), stamp[k]}, k});
    }
    std::sort(model.begin(), model.end());
    ASSERT_EQ(lru.size(), static_cast<int64_t>(model.size()));
    ASSERT_EQ(lru.Victim(), model.empty() ? LruEviction::kNone : model.front().second) << "step " << step;
    if (step % 53 == 0) {
      std::vector<int64_t> forward, want;
      for (int64_t k = lru.Victim(); k != LruEviction::kNone; k = lru.Next(k)) forward.push_back(k);
      for (const auto& m : model) want.push_back(m.second);
      ASSERT_EQ(forward, want);
      std::vector<int64_t> backward;
      for (int64_t k = want.empty() ? LruEviction::kNone : want.back(); k != LruEviction::kNone; k = lru.Prev(k)) {
        backward.push_back(k);
      }
      std::reverse(backward.begin(), backward.end());
      ASSERT_EQ(backward, want);
    }
  }
  EXPECT_GT(changes, 100);  // grants ended and re-keyed their ids
}

// A retained prefix outlives more recent ones until its grant ends, then
// is evicted in its LRU place; the forest's counts follow.
TEST(LruEvictionTest, TheForestEvictsRetainedPrefixesLastUntilTheirGrantEnds) {
  ManualClock clock;
  PrefixForestOptions o;
  o.chunk_size = 16;
  o.num_chunks = 6;
  o.clock = &clock;
  auto f = PrefixForest::Create(o).value();
  auto prompt = [](int base) {
    std::vector<TokenId> t(32);
    for (int i = 0; i < 32; ++i) t[i] = base + i;
    return t;
  };
  // a (retained at 80 for 60 s, its first chunk only), then b and c: plain.
  auto a = f->Insert(prompt(0), "t").value();
  ASSERT_TRUE(f->MarkComputed(a.seq_id).ok());
  auto kept = f->Retain(a.seq_id, 16, {80, clock.Now() + absl::Seconds(60)}, 10).value();
  EXPECT_EQ(kept.chunks, 1);
  EXPECT_EQ(f->RaisedPerNamespace(), (std::vector<std::pair<std::string, int32_t>>{{"t", 1}}));
  const ChunkId a0 = f->Chunks(a.seq_id).value()[0], a1 = f->Chunks(a.seq_id).value()[1];
  ASSERT_TRUE(f->Remove(a.seq_id).ok());
  for (int base : {100, 200}) {
    auto s = f->Insert(prompt(base), "t").value();
    ASSERT_TRUE(f->MarkComputed(s.seq_id).ok());
    ASSERT_TRUE(f->Remove(s.seq_id).ok());
  }
  // Four chunks wanted: a's leaf (default, oldest) and b's two go, a's retained root stays.
  auto d = f->Insert(std::vector<TokenId>(64, 7), "u").value();
  EXPECT_EQ(f->State(a0), PrefixForest::ChunkState::kCached);
  EXPECT_EQ(f->State(a1), PrefixForest::ChunkState::kUsed);  // reused for d (the first chunk evicted)
  EXPECT_EQ(f->stats().band_evictions_total[static_cast<int>(RetentionBand::kDefault)], 4);
  EXPECT_EQ(f->stats().band_chunks[static_cast<int>(RetentionBand::kHigh)], 1);
  ASSERT_TRUE(f->MarkComputed(d.seq_id).ok());
  ASSERT_TRUE(f->Remove(d.seq_id).ok());
  // The grant ends: a's root is back at the default, and the oldest cached.
  clock.Advance(absl::Seconds(61));
  f->ExpireRetention();
  EXPECT_EQ(f->ChunkPriority(a0), kDefaultRetentionPriority);
  EXPECT_TRUE(f->RaisedPerNamespace().empty());
  EXPECT_EQ(f->EvictCached(1), 1);
  EXPECT_EQ(f->State(a0), PrefixForest::ChunkState::kFree);
  EXPECT_TRUE(f->CheckInvariants().ok()) << f->CheckInvariants();
}

TEST(LruEvictionTest, TheForestReportsHowLongItsOldestCachedPrefixHasWaited) {
  ManualClock clock;
  PrefixForestOptions o;
  o.chunk_size = 16;
  o.num_chunks = 4;
  o.clock = &clock;
  auto f = PrefixForest::Create(o).value();
  std::vector<TokenId> a(32), b(32);
  for (int i = 0; i < 32; ++i) a[i] = i, b[i] = 100 + i;
  auto sa = f->Insert(a).value();
  auto sb = f->Insert(b).value();
  ASSERT_TRUE(f->MarkComputed(sa.seq_id).ok());
  ASSERT_TRUE(f->MarkComputed(sb.seq_id).ok());
  EXPECT_EQ(f->stats().oldest_cached_seconds, 0);  // nothing cached
  ASSERT_TRUE(f->Remove(sa.seq_id).ok());
  clock.Advance(absl::Seconds(40));
  ASSERT_TRUE(f->Remove(sb.seq_id).ok());
  clock.Advance(absl::Seconds(2));
  EXPECT_DOUBLE_EQ(f->stats().oldest_cached_seconds, 42);
  // A hit on a's prefix takes both its chunks back: b's become the oldest.
  auto again = f->Insert(a).value();
  EXPECT_EQ(again.matched_tokens, 32);
  EXPECT_DOUBLE_EQ(f->stats().oldest_cached_seconds, 2);
  EXPECT_TRUE(f->CheckInvariants().ok()) << f->CheckInvariants();
}

}  // namespace
}  // namespace chunkattn
