// LruEviction alone (against a list model), then its age through the forest.
#include "services/core/lru_eviction.h"

#include <algorithm>
#include <list>

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
