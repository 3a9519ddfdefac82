#include "workers/collectives/in_process_group.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "workers/collectives/communicator.h"
#include "workers/collectives/tests/test_util.h"

namespace chunkattn {
namespace {

using testing::RandomInput;
using testing::RunRanks;

// The contract's sum: ((x0 + x1) + x2) + ... per element.
std::vector<float> RankOrderSum(int world, int step, int64_t n) {
  std::vector<float> sum = RandomInput(0, step, n);
  for (int r = 1; r < world; ++r) {
    const std::vector<float> x = RandomInput(r, step, n);
    for (int64_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  return sum;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  // An empty vector's data() may be null, which memcmp must not see.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(SingleRankCommunicatorTest, CollectivesAreNoOps) {
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  const std::vector<float> before = x;
  ASSERT_TRUE(comm->AllReduceSum(x.data(), 3).ok());
  EXPECT_EQ(x, before);
  char bytes[4] = {1, 2, 3, 4};
  ASSERT_TRUE(comm->Broadcast(bytes, 4, 0).ok());
  EXPECT_EQ(bytes[3], 4);
  EXPECT_TRUE(comm->Barrier().ok());
  EXPECT_TRUE(comm->AllReduceSum(nullptr, 0).ok());
}

TEST(SingleRankCommunicatorTest, RejectsBadArguments) {
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  float x = 0;
  EXPECT_EQ(comm->AllReduceSum(&x, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->AllReduceSum(nullptr, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Broadcast(&x, 4, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Broadcast(&x, 4, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Broadcast(&x, -4, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Broadcast(nullptr, 4, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessGroupTest, RejectsBadGroupArguments) {
  EXPECT_EQ(MakeInProcessGroup(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeInProcessGroup(-3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeInProcessGroup(2, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto group = MakeInProcessGroup(3);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ((*group)[r]->rank(), r);
    EXPECT_EQ((*group)[r]->world_size(), 3);
  }
}

// A seeded random walk over AllReduceSum / Broadcast / Barrier. Every rank
// draws the same sequence of operations and sizes; after every all-reduce
// each rank's buffer must equal the rank-order sum bit for bit (which also
// makes the ranks bit-identical to each other).
class InProcessGroupWalkTest : public ::testing::TestWithParam<int> {};

TEST_P(InProcessGroupWalkTest, SumsAreExactAndIdenticalOverManyCalls) {
  const int world = GetParam();
  auto group = MakeInProcessGroup(world, absl::Seconds(30));
  ASSERT_TRUE(group.ok()) << group.status();
  constexpr int kSteps = 600;
  std::vector<int> failures(world, 0);
  std::vector<int> reduces(world, 0);
  RunRanks(*group, [&](Communicator& comm) {
    const int r = comm.rank();
    std::mt19937 shared(12345);  // same stream on every rank
    for (int step = 0; step < kSteps; ++step) {
      const int op = static_cast<int>(shared() % 10);
      const int64_t n = (shared() % 8 == 0) ? static_cast<int64_t>(shared() % 4)
                                            : static_cast<int64_t>(shared() % 5000);
      if (op < 7) {
        std::vector<float> x = RandomInput(r, step, n);
        const absl::Status s = comm.AllReduceSum(x.data(), n);
        if (!s.ok() || !BitEqual(x, RankOrderSum(world, step, n))) {
          ADD_FAILURE() << "rank " << r << " step " << step << " n " << n << ": " << s;
          if (++failures[r] > 3) return;
        }
        ++reduces[r];
      } else if (op < 9) {
        const int root = static_cast<int>(shared() % world);
        std::vector<uint8_t> bytes(n, static_cast<uint8_t>(r));
        if (r == root) {
          for (int64_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + step);
        }
        const absl::Status s = comm.Broadcast(bytes.data(), n, root);
        bool ok = s.ok();
        for (int64_t i = 0; ok && i < n; ++i) ok = bytes[i] == static_cast<uint8_t>(i * 7 + step);
        if (!ok) {
          ADD_FAILURE() << "rank " << r << " step " << step << " broadcast: " << s;
          if (++failures[r] > 3) return;
        }
      } else {
        const absl::Status s = comm.Barrier();
        if (!s.ok()) {
          ADD_FAILURE() << "rank " << r << " step " << step << " barrier: " << s;
          if (++failures[r] > 3) return;
        }
      }
    }
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(failures[r], 0) << "rank " << r;
    EXPECT_GT(reduces[r], kSteps / 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, InProcessGroupWalkTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("World", info.param);
                         });

// The model's size: a hidden state of a batch, ~1M floats, many times.
TEST(InProcessGroupTest, LargeBuffersRepeatedly) {
  constexpr int kWorld = 4;
  constexpr int64_t kN = 1 << 20;
  auto group = MakeInProcessGroup(kWorld, absl::Seconds(30));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<float> expected = RankOrderSum(kWorld, 7, kN);
  std::vector<int> mismatches(kWorld, 0);
  RunRanks(*group, [&](Communicator& comm) {
    const std::vector<float> input = RandomInput(comm.rank(), 7, kN);
    std::vector<float> x;
    for (int rep = 0; rep < 10; ++rep) {
      x = input;
      ASSERT_TRUE(comm.AllReduceSum(x.data(), kN).ok());
      if (!BitEqual(x, expected)) ++mismatches[comm.rank()];
    }
  });
  EXPECT_EQ(mismatches, std::vector<int>(kWorld, 0));
}

TEST(InProcessGroupTest, MissingRankTimesOutAndBreaksGroup) {
  auto group = MakeInProcessGroup(2, absl::Milliseconds(200));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<float> x(16, 1.0f);
  const absl::Time start = absl::Now();
  const absl::Status s = (*group)[0]->AllReduceSum(x.data(), 16);
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(waited, absl::Milliseconds(150));
  EXPECT_LT(waited, absl::Seconds(10));
  EXPECT_EQ(x, std::vector<float>(16, 1.0f));
  // The late rank, and the group afterwards, fail at once.
  EXPECT_EQ((*group)[1]->AllReduceSum(x.data(), 16).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*group)[0]->Barrier().code(), absl::StatusCode::kUnavailable);
}

TEST(InProcessGroupTest, WaitingRanksFailWhenOneTimesOut) {
  // Ranks 0 and 1 arrive, rank 2 never does: one of them times out, the
  // other is released by the break; neither hangs.
  auto group = MakeInProcessGroup(3, absl::Milliseconds(300));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { status[r] = (*group)[r]->Barrier(); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) {
    EXPECT_TRUE(s.code() == absl::StatusCode::kDeadlineExceeded ||
                s.code() == absl::StatusCode::kUnavailable)
        << s;
  }
  EXPECT_TRUE(status[0].code() == absl::StatusCode::kDeadlineExceeded ||
              status[1].code() == absl::StatusCode::kDeadlineExceeded);
}

TEST(InProcessGroupTest, DisagreeingCallsFailOnEveryRankAndLeaveBuffersAlone) {
  auto group = MakeInProcessGroup(2, absl::Seconds(30));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<absl::Status> status(2);
  std::vector<std::vector<float>> data = {{1, 2, 3, 4}, {10, 20, 30, 40, 50}};
  RunRanks(*group, [&](Communicator& comm) {
    const int r = comm.rank();
    status[r] = comm.AllReduceSum(data[r].data(), static_cast<int64_t>(data[r].size()));
  });
  EXPECT_EQ(status[0].code(), absl::StatusCode::kInvalidArgument) << status[0];
  EXPECT_EQ(status[1].code(), absl::StatusCode::kInvalidArgument) << status[1];
  EXPECT_EQ(data[0], (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(data[1], (std::vector<float>{10, 20, 30, 40, 50}));

  // Different kinds, then different roots.
  RunRanks(*group, [&](Communicator& comm) {
    const int r = comm.rank();
    status[r] = r == 0 ? comm.Barrier() : comm.AllReduceSum(data[r].data(), 5);
  });
  EXPECT_EQ(status[0].code(), absl::StatusCode::kInvalidArgument) << status[0];
  EXPECT_EQ(status[1].code(), absl::StatusCode::kInvalidArgument) << status[1];
  RunRanks(*group, [&](Communicator& comm) {
    const int r = comm.rank();
    status[r] = comm.Broadcast(data[r].data(), 8, /*root=*/r);
  });
  EXPECT_EQ(status[0].code(), absl::StatusCode::kInvalidArgument) << status[0];
  EXPECT_EQ(data[1], (std::vector<float>{10, 20, 30, 40, 50}));

  // A disagreement is the callers' bug, not a broken group: it still works.
  RunRanks(*group, [&](Communicator& comm) {
    const int r = comm.rank();
    status[r] = comm.AllReduceSum(data[r].data(), 4);
  });
  ASSERT_TRUE(status[0].ok() && status[1].ok()) << status[0] << " " << status[1];
  EXPECT_EQ(data[0], (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(data[1], (std::vector<float>{11, 22, 33, 44, 50}));
}

TEST(InProcessGroupTest, BadArgumentsFailLocallyWithoutCommunicating) {
  auto group = MakeInProcessGroup(2, absl::Seconds(30));
  ASSERT_TRUE(group.ok()) << group.status();
  Communicator& rank0 = *(*group)[0];
  float x[2] = {1, 2};
  // Each returns at once (no peer is calling), without breaking the group.
  EXPECT_EQ(rank0.AllReduceSum(x, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rank0.AllReduceSum(nullptr, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rank0.Broadcast(x, 8, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rank0.Broadcast(x, 8, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rank0.Broadcast(nullptr, 8, 0).code(), absl::StatusCode::kInvalidArgument);
  // Size zero is a no-op that does not wait for the peer.
  EXPECT_TRUE(rank0.AllReduceSum(nullptr, 0).ok());
  EXPECT_TRUE(rank0.Broadcast(nullptr, 0, 1).ok());
  std::vector<absl::Status> status(2);
  RunRanks(*group, [&](Communicator& comm) { status[comm.rank()] = comm.Barrier(); });
  EXPECT_TRUE(status[0].ok() && status[1].ok());
}

}  // namespace
}  // namespace chunkattn
