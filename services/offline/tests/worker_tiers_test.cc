// The KV tiers across the wire: the coordinator's WorkerPool joined to two
// in-process worker services (tensor parallel, TP=2, on 127.0.0.1) with
// tiers of different sizes. The pool offers the slots every rank has, a
// plan's moves reach both ranks, the step's failed_moves are the union of
// what failed on either, and a new session (Join) starts with empty tiers.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/coordinator/worker_pool.h"
#include "workers/server/kv_tier_store.h"
#include "workers/server/worker_service.h"
#include "base/tests/temp_dir.h"

namespace chunkattn {
namespace {

// A worker service on an ephemeral port of 127.0.0.1.
struct Worker {
  explicit Worker(const WorkerOptions& options) : service(options) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Worker() {
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  WorkerService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// Two layers, two KV heads (one per rank), head_dim 16, chunks of 16 tokens
// in fp32: 2 * 2 * 16 * 16 * 4 = 4096 bytes per chunk on each rank.
constexpr int64_t kRankChunkBytes = 4096;
constexpr int64_t kSlotBytes = KvTierStore::kHeaderBytes + kRankChunkBytes;

// A model folder of just its config.json (dummy weights).
std::string WriteConfig(const std::string& dir) {
  const std::string folder = dir + "/model";
  std::filesystem::create_directory(folder);
  std::ofstream(folder + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "max_position_embeddings": 512, "eos_token_id": 96, "torch_dtype": "float32"})";
  return folder;
}

TEST(WorkerTiers, FailedMovesAreTheUnionOverRanks) {
  const std::string dir = testing::MakeTempDir("worker-tiers");
  ASSERT_FALSE(dir.empty());
  const std::string disk_dir = dir + "/disk";
  std::filesystem::create_directory(disk_dir);
  WorkerOptions base;
  base.threads = 1;
  base.kv_cache_bytes = int64_t{4} << 20;
  // Rank 0: 4 host slots and 3 on disk; rank 1: 6 host slots, no disk.
  WorkerOptions o0 = base, o1 = base;
  o0.kv_tiers.host_bytes = 4 * kSlotBytes;
  o0.kv_tiers.disk_dir = disk_dir;
  o0.kv_tiers.disk_bytes = 3 * kSlotBytes;
  o1.kv_tiers.host_bytes = 6 * kSlotBytes + 100;
  Worker rank0(o0), rank1(o1);
  ASSERT_NE(rank0.server, nullptr);
  ASSERT_NE(rank1.server, nullptr);

  WorkerPoolOptions po;
  po.addresses = {rank0.address(), rank1.address()};
  po.join.set_model(WriteConfig(dir));
  po.join.set_load_format("dummy");
  po.join.set_dummy_seed(3);
  po.join.set_chunk_size(16);
  po.join.set_kv_dtype("float32");
  po.join.set_collective_timeout_ms(20000);
  po.join_timeout = absl::Seconds(60);
  WorkerPool pool(po);
  const absl::Status connected = pool.Connect();
  ASSERT_TRUE(connected.ok()) << connected;
  EXPECT_EQ(pool.host_kv_slots(), 4);  // the fewest any rank has
  EXPECT_EQ(pool.disk_kv_slots(), 0);  // rank 1 has none
  EXPECT_EQ(pool.chunk_bytes_total(), 2 * kRankChunkBytes);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(disk_dir), {}), 1);  // rank 0's file

  uint64_t step = 0;
  auto run = [&](std::vector<KvMove> moves) -> std::vector<int32_t> {
    StepPlan plan;
    plan.step = ++step;
    plan.moves = std::move(moves);
    absl::StatusOr<StepResult> result = pool.Step(&plan, nullptr);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->failed_moves : std::vector<int32_t>{-1};
  };
  EXPECT_EQ(run({KvMove::Store(KvTier::kHost, 0, 3, 11),     // both ranks
                 KvMove::Store(KvTier::kHost, 5, 3, 12),     // rank 1 only: rank 0 has 4 slots
                 KvMove::Store(KvTier::kDisk, 0, 3, 13),     // rank 0 only: rank 1 has no disk
                 KvMove::Load(KvTier::kHost, 0, 4, 11),      // both
                 KvMove::Load(KvTier::kHost, 0, 4, 99),      // neither: another key
                 KvMove::Load(KvTier::kHost, 5, 6, 12)}),    // rank 1 only
            (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_EQ(run({KvMove::Load(KvTier::kHost, 0, 7, 11)}), std::vector<int32_t>{});

  // A new session: empty tiers (and a new disk file for the old one's).
  pool.Disconnect();
  const absl::Status again = pool.Connect();
  ASSERT_TRUE(again.ok()) << again;
  step = 0;
  EXPECT_EQ(run({KvMove::Load(KvTier::kHost, 0, 7, 11)}), std::vector<int32_t>{0});
  // The old session's file goes once its stream's handler lets go of it.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (std::distance(std::filesystem::directory_iterator(disk_dir), {}) != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(disk_dir), {}), 1);
  pool.Disconnect();
}

}  // namespace
}  // namespace chunkattn
