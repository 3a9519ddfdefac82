#include "workers/collectives/gloo_communicator.h"

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "workers/collectives/communicator.h"
#include "workers/collectives/tests/test_util.h"
#include "workers/collectives/in_process_group.h"

extern char** environ;

namespace chunkattn {
namespace {

using testing::RandomInput;
using testing::RunRanks;

// A fresh directory for one group's FileStore, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "chunkattn-gloo-XXXXXX";
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << std::strerror(errno);
    path_ = made ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

GlooOptions Options(int rank, int world, const std::string& store_path,
                    absl::Duration timeout = absl::Seconds(20)) {
  GlooOptions options;
  options.rank = rank;
  options.world_size = world;
  options.store_path = store_path;
  options.prefix = "test";
  options.timeout = timeout;
  return options;
}

// Connects ranks 0..world-1 on one thread each; returns them in rank order.
std::vector<std::unique_ptr<Communicator>> ConnectOnThreads(
    int world, const std::function<absl::StatusOr<std::unique_ptr<Communicator>>(int)>& connect) {
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> results;
  for (int r = 0; r < world; ++r) results.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { results[r] = connect(r); });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    if (results[r].ok()) comms.push_back(std::move(*results[r]));
  }
  return comms;
}

TEST(GlooCommunicatorTest, RejectsBadOptions) {
  TempDir dir;
  GlooOptions bad = Options(0, 2, dir.path());
  bad.world_size = 0;
  EXPECT_EQ(ConnectGloo(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Options(2, 2, dir.path());
  EXPECT_EQ(ConnectGloo(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Options(-1, 2, dir.path());
  EXPECT_EQ(ConnectGloo(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Options(0, 2, dir.path() + "/does-not-exist");
  EXPECT_EQ(ConnectGloo(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Options(0, 2, "");
  EXPECT_EQ(ConnectGloo(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Options(0, 2, dir.path(), absl::ZeroDuration());
  EXPECT_EQ(ConnectGloo(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectGloo(Options(0, 2, dir.path()), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooCommunicatorTest, WorldOfOneNeedsNoPeers) {
  TempDir dir;
  auto comm = ConnectGloo(Options(0, 1, dir.path()));
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> x = {1, 2, 3};
  ASSERT_TRUE((*comm)->AllReduceSum(x.data(), 3).ok());
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  EXPECT_TRUE((*comm)->Barrier().ok());
}

// Two ranks on two threads of this process, over real TCP sockets: every
// all-reduce equals the in-process group's (for two ranks the ring's order
// and rank order give the same bits), broadcast and barrier work, and the
// ranks hold identical bits.
TEST(GlooCommunicatorTest, TwoThreadsMatchInProcessGroup) {
  TempDir dir;
  auto gloo = ConnectOnThreads(2, [&](int r) { return ConnectGloo(Options(r, 2, dir.path())); });
  ASSERT_EQ(gloo.size(), 2u);
  EXPECT_EQ(gloo[1]->rank(), 1);
  EXPECT_EQ(gloo[1]->world_size(), 2);
  auto oracle = MakeInProcessGroup(2, absl::Seconds(20));
  ASSERT_TRUE(oracle.ok()) << oracle.status();

  const std::vector<int64_t> sizes = {1, 2, 3, 17, 1000, 4097, 300000};
  for (int step = 0; step < static_cast<int>(sizes.size()); ++step) {
    const int64_t n = sizes[step];
    std::vector<std::vector<float>> via_gloo(2), via_oracle(2);
    for (int r = 0; r < 2; ++r) via_gloo[r] = via_oracle[r] = RandomInput(r, step, n, 100.0f);
    RunRanks(gloo, [&](Communicator& c) {
      const absl::Status s = c.AllReduceSum(via_gloo[c.rank()].data(), n);
      EXPECT_TRUE(s.ok()) << "rank " << c.rank() << ": " << s;
    });
    RunRanks(*oracle, [&](Communicator& c) {
      ASSERT_TRUE(c.AllReduceSum(via_oracle[c.rank()].data(), n).ok());
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(std::memcmp(via_gloo[r].data(), via_oracle[r].data(), n * sizeof(float)), 0)
          << "n " << n << " rank " << r;
    }
  }

  std::vector<std::vector<uint8_t>> bytes = {std::vector<uint8_t>(5000, 0),
                                             std::vector<uint8_t>(5000, 0)};
  for (int i = 0; i < 5000; ++i) bytes[1][i] = static_cast<uint8_t>(i * 13 + 1);
  const std::vector<uint8_t> sent = bytes[1];
  RunRanks(gloo, [&](Communicator& c) {
    EXPECT_TRUE(c.Broadcast(bytes[c.rank()].data(), 5000, /*root=*/1).ok());
    EXPECT_TRUE(c.Barrier().ok());
  });
  EXPECT_EQ(bytes[0], sent);
  EXPECT_EQ(bytes[1], sent);
}

// The overload a coordinator-backed store will use, here with gloo's
// in-memory HashStore; three ranks exercise a real ring.
TEST(GlooCommunicatorTest, ThreeRanksThroughCallerStore) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto gloo = ConnectOnThreads(3, [&](int r) { return ConnectGloo(Options(r, 3, ""), store); });
  ASSERT_EQ(gloo.size(), 3u);
  // Integer-valued inputs: the sum is exact whatever order the ring adds in.
  constexpr int64_t kN = 10007;
  std::vector<std::vector<float>> x(3, std::vector<float>(kN));
  for (int r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < kN; ++i) x[r][i] = static_cast<float>((i * (r + 1)) % 1000);
  }
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<std::vector<float>> y = x;
    RunRanks(gloo, [&](Communicator& c) {
      const absl::Status s = c.AllReduceSum(y[c.rank()].data(), kN);
      EXPECT_TRUE(s.ok()) << s;
    });
    for (int r = 0; r < 3; ++r) {
      for (int64_t i = 0; i < kN; ++i) {
        ASSERT_EQ(y[r][i], x[0][i] + x[1][i] + x[2][i]) << "rank " << r << " i " << i;
      }
    }
  }
}

TEST(GlooCommunicatorTest, PeerThatNeverShowsUpTimesOut) {
  TempDir dir;
  const absl::Time start = absl::Now();
  auto comm = ConnectGloo(Options(0, 2, dir.path(), absl::Seconds(1)));
  const absl::Duration waited = absl::Now() - start;
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(waited, absl::Seconds(10));
}

TEST(GlooCommunicatorTest, CollectiveTimesOutWhenPeerDoesNotCall) {
  TempDir dir;
  auto gloo = ConnectOnThreads(
      2, [&](int r) { return ConnectGloo(Options(r, 2, dir.path(), absl::Seconds(1))); });
  ASSERT_EQ(gloo.size(), 2u);
  // Rank 1 is connected and alive but never joins the all-reduce.
  std::vector<float> x(1000, 1.0f);
  const absl::Time start = absl::Now();
  const absl::Status s = gloo[0]->AllReduceSum(x.data(), 1000);
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(waited, absl::Milliseconds(900));
  EXPECT_LT(waited, absl::Seconds(10));
  EXPECT_EQ(gloo[0]->AllReduceSum(x.data(), 1000).code(), absl::StatusCode::kUnavailable);
}

TEST(GlooCommunicatorTest, PeerGoneMidwayFailsAndBreaksCommunicator) {
  TempDir dir;
  auto gloo = ConnectOnThreads(
      2, [&](int r) { return ConnectGloo(Options(r, 2, dir.path(), absl::Seconds(2))); });
  ASSERT_EQ(gloo.size(), 2u);
  gloo[1].reset();  // closes rank 1's connections
  std::vector<float> x(1000, 1.0f);
  const absl::Time start = absl::Now();
  const absl::Status s = gloo[0]->AllReduceSum(x.data(), 1000);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  EXPECT_EQ(gloo[0]->Barrier().code(), absl::StatusCode::kUnavailable);
}

#ifdef CHUNKATTN_GLOO_CHECK_BIN
// Runs `world` chunkattn-gloo-check processes on one fresh store; each must
// exit 0 within the deadline (stragglers are killed).
void RunCheckProcesses(int world) {
  TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args = {CHUNKATTN_GLOO_CHECK_BIN,
                                     "--rank=" + std::to_string(r),
                                     "--world=" + std::to_string(world),
                                     "--store=" + dir.path(),
                                     "--n=100003",
                                     "--timeout_s=20"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int err = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
    ASSERT_EQ(err, 0) << "posix_spawn " << argv[0] << ": " << std::strerror(err);
    pids.push_back(pid);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<int> exit_code(world, -1);
  int running = world;
  while (running > 0 && absl::Now() < deadline) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] == 0) continue;
      int wstatus = 0;
      if (waitpid(pids[r], &wstatus, WNOHANG) == pids[r]) {
        exit_code[r] = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        pids[r] = 0;
        --running;
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (int r = 0; r < world; ++r) {
    if (pids[r] != 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
      ADD_FAILURE() << "rank " << r << " still running after 60 s; killed";
    } else {
      EXPECT_EQ(exit_code[r], 0) << "rank " << r;
    }
  }
}

TEST(GlooProcessTest, TwoProcesses) { RunCheckProcesses(2); }
TEST(GlooProcessTest, ThreeProcesses) { RunCheckProcesses(3); }
#endif

}  // namespace
}  // namespace chunkattn
