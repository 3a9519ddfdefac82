// Storage conversions (against the hardware's where it has them) and the
// thread pool's contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/api/dtype.h"
#include "kernels/cpu/attention.h"
#include "base/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace chunkattn {
namespace {

#if defined(__x86_64__)
__attribute__((target("f16c"))) float HwHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t HwFloatToHalf(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#endif

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(DTypeTest, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << h;
  }
}

TEST(DTypeTest, HalfConversionsMatchF16C) {
#if defined(__x86_64__)
  if (!cpu::CpuHasF16c()) GTEST_SKIP() << "no F16C on this CPU";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = HwHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) continue;
    EXPECT_EQ(Bits(HalfToFloat(static_cast<uint16_t>(h))), Bits(want)) << h;
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t b = any(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), HwFloatToHalf(f)) << f;
  }
#else
  GTEST_SKIP() << "not x86-64";
#endif
}

TEST(DTypeTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-2.5f)), -2.5f);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (int i = 0; i < 10000; ++i) {
    const float f = normal(rng);
    EXPECT_LE(std::fabs(BFloat16ToFloat(FloatToBFloat16(f)) - f), std::fabs(f) / 256);
  }
}

TEST(DTypeTest, Names) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) EXPECT_EQ(ParseDType(DTypeName(t)), t);
  EXPECT_FALSE(ParseDType("fp8").has_value());
}

TEST(ThreadPoolTest, EveryItemRunsExactlyOnce) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.num_threads(), 4);
  for (int64_t n : {0, 1, 3, 4, 1000}) {
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> bad_thread{0};
      pool.ParallelFor(n, [&](int64_t i, int t) {
        hits[i].fetch_add(1);
        if (t < 0 || t >= 4) bad_thread.fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " item " << i;
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

// ShrinkingPieces against its definition, on random sizes: the pieces tile
// [0, n) in order, every boundary but n is a multiple of `align`, each piece
// but the last is the rounded-up max(min_piece, left / threads), so sizes
// never grow until the last, which holds what is left.
TEST(ThreadPoolTest, ShrinkingPiecesTileTheRangeAndShrink) {
  EXPECT_TRUE(ShrinkingPieces(0, 2, 32, 4).empty());
  EXPECT_EQ(ShrinkingPieces(1024, 2, 32, 4), (std::vector<int64_t>{0, 512, 768, 896, 960, 992, 1024}));
  EXPECT_EQ(ShrinkingPieces(10, 1, 32, 4), (std::vector<int64_t>{0, 10}));  // one thread: one piece
  EXPECT_EQ(ShrinkingPieces(5, 3, 1, 4), (std::vector<int64_t>{0, 4, 5}));
  std::mt19937 rng(7);
  for (int rep = 0; rep < 2000; ++rep) {
    const int64_t n = 1 + rng() % 40000, min_piece = 1 + rng() % 64, align = 1 + rng() % 8;
    const int threads = 1 + static_cast<int>(rng() % 16);
    const std::vector<int64_t> b = ShrinkingPieces(n, threads, min_piece, align);
    ASSERT_GE(b.size(), 2u);
    ASSERT_EQ(b.front(), 0);
    ASSERT_EQ(b.back(), n);
    for (size_t i = 1; i < b.size(); ++i) {
      const int64_t piece = b[i] - b[i - 1], left = n - b[i - 1];
      ASSERT_GT(piece, 0);
      const int64_t want = (std::max(min_piece, left / threads) + align - 1) / align * align;
      if (i + 1 < b.size()) {
        ASSERT_EQ(piece, want) << "n " << n << " threads " << threads << " piece " << i;
        ASSERT_EQ(b[i] % align, 0);
        if (i > 1) {
          ASSERT_LE(piece, b[i - 1] - b[i - 2]);
        }
      } else {
        ASSERT_LE(piece, want) << "the last piece is what is left";
      }
    }
  }
}

// The pool's threads spin for the next loop, then sleep (kSpinMicros): loops
// back to back (caught spinning), after pauses past the spin (woken from
// sleep), and in between, each loop's writes visible to the next loop's
// items and every item run once. Under TSan this is the race check of the
// handoff between spinning, sleeping and the caller's wait.
TEST(ThreadPoolTest, LoopsAfterSpinningAndAfterSleepingHandOffCleanly) {
  ThreadPool pool(3);
  std::vector<int64_t> data(257, 0), loops(257, 0);  // loops[i]: earlier loops that ran item i
  const int64_t pause_us[] = {0, 0, 1, ThreadPool::kSpinMicros / 2, ThreadPool::kSpinMicros * 3};
  for (int rep = 0; rep < 200; ++rep) {
    const int64_t n = 1 + (rep * 37) % 257;
    std::atomic<int> wrong{0};
    pool.ParallelFor(n, [&](int64_t i, int) {
      if (data[i] != (i + 1) * loops[i]) wrong.fetch_add(1);  // the previous loops' writes are visible
      data[i] += i + 1;
    });
    ASSERT_EQ(wrong.load(), 0) << "rep " << rep;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(data[i], (i + 1) * ++loops[i]) << "rep " << rep << " item " << i;
    if (pause_us[rep % 5] > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us[rep % 5]));
  }
}

TEST(ThreadPoolTest, UsesItsThreadsAndShutsDownCleanly) {
  std::atomic<int> used_mask{0};
  {
    ThreadPool pool(3);
    for (int rep = 0; rep < 100 && used_mask.load() != 7; ++rep) {
      pool.ParallelFor(64, [&](int64_t, int t) {
        used_mask.fetch_or(1 << t);
        volatile double x = 0;
        for (int i = 0; i < 20000; ++i) x = x + 1;
      });
    }
  }
  EXPECT_EQ(used_mask.load(), 7);
}

}  // namespace
}  // namespace chunkattn

TEST(ThreadPoolTest, CgroupCpuMaxRoundsUpAndIgnoresNoLimit) {
  using chunkattn::CpusFromCgroupCpuMax;
  EXPECT_EQ(CpusFromCgroupCpuMax("200000 100000"), 2);
  EXPECT_EQ(CpusFromCgroupCpuMax("150000 100000\n"), 2);  // 1.5 CPUs: round up
  EXPECT_EQ(CpusFromCgroupCpuMax("50000 100000"), 1);
  EXPECT_EQ(CpusFromCgroupCpuMax("max 100000"), 0);
  EXPECT_EQ(CpusFromCgroupCpuMax(""), 0);
  EXPECT_EQ(CpusFromCgroupCpuMax("12x 100000"), 0);
  EXPECT_EQ(CpusFromCgroupCpuMax("100000 0"), 0);
  EXPECT_EQ(CpusFromCgroupCpuMax("-1 100000"), 0);
}

TEST(ThreadPoolTest, AvailableCpusIsWithinTheHardware) {
  const int n = chunkattn::AvailableCpus();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(chunkattn::ThreadPool().num_threads(), n);
}
