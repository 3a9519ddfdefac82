#include "services/coordinator/text_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace chunkattn {
namespace {

TEST(TextPoolTest, RunsEveryTaskAcceptedAndRefusesBeyondTheQueue) {
  std::atomic<int> ran{0};
  absl::Notification release;
  int accepted = 0;
  int refused = 0;
  {
    TextPool pool(2, 8);
    // Two tasks hold both threads, so the next 8 queue and the rest are refused.
    absl::Notification started[2];
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(pool.Post([&, i] {
        started[i].Notify();
        release.WaitForNotification();
        ++ran;
      }));
    }
    for (auto& s : started) s.WaitForNotification();
    for (int i = 0; i < 20; ++i) {
      if (pool.Post([&] { ++ran; })) {
        ++accepted;
      } else {
        ++refused;
      }
    }
    release.Notify();
  }  // the destructor runs what is queued
  EXPECT_EQ(accepted, 8);
  EXPECT_EQ(refused, 12);
  EXPECT_EQ(ran.load(), 10);
}

TEST(TextPoolTest, ManyPostersFromManyThreads) {
  std::atomic<int> ran{0};
  std::atomic<int> accepted{0};
  {
    TextPool pool(3, 1 << 20);
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) accepted += pool.Post([&] { ++ran; }) ? 1 : 0;
      });
    }
    for (auto& p : posters) p.join();
  }
  EXPECT_EQ(accepted.load(), 4000);
  EXPECT_EQ(ran.load(), 4000);
}

}  // namespace
}  // namespace chunkattn
