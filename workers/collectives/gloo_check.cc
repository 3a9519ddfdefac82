// chunkattn-gloo-check: one rank of a Gloo group, for multi-process checks.
//
//   chunkattn-gloo-check --rank R --world W --store DIR [--n N]
//
// Start W processes (ranks 0..W-1) with the same --store directory (fresh,
// or a --prefix not used there before). Each all-reduces a rank-dependent
// pattern and checks the closed-form sum, broadcasts from the last rank,
// barriers, prints "gloo ok rank R" and exits 0; on any failure it prints
// the reason to stderr and exits 1.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "workers/collectives/gloo_communicator.h"

ABSL_FLAG(int, rank, -1, "this process's rank in [0, world)");
ABSL_FLAG(int, world, 0, "number of ranks");
ABSL_FLAG(std::string, store, "", "shared directory for the FileStore rendezvous");
ABSL_FLAG(std::string, prefix, "gloo-check", "store key prefix");
ABSL_FLAG(int64_t, n, 1 << 16, "floats per all-reduce (also bytes broadcast)");
ABSL_FLAG(int, iters, 3, "all-reduce rounds");
ABSL_FLAG(double, timeout_s, 30, "rendezvous and per-collective timeout, seconds");

namespace chunkattn {
namespace {

// Rank r's element i in round `iter`. Multiples of 0.5 below 2^20: every
// partial sum is exact in float, whatever order the ring adds in.
float Pattern(int r, int64_t i, int iter) {
  return static_cast<float>(i % 1024) * 0.5f + 1000.0f * r + static_cast<float>(iter);
}

float ExpectedSum(int world, int64_t i, int iter) {
  return static_cast<float>(world) * (static_cast<float>(i % 1024) * 0.5f + iter) +
         1000.0f * (world * (world - 1) / 2);
}

uint8_t BroadcastByte(int64_t i) { return static_cast<uint8_t>((i * 31 + 7) & 0xff); }

absl::Status Run() {
  GlooOptions options;
  options.rank = absl::GetFlag(FLAGS_rank);
  options.world_size = absl::GetFlag(FLAGS_world);
  options.store_path = absl::GetFlag(FLAGS_store);
  options.prefix = absl::GetFlag(FLAGS_prefix);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  const int64_t n = absl::GetFlag(FLAGS_n);
  if (n < 0) return absl::InvalidArgumentError("--n must be >= 0");
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, ConnectGloo(options));
  const int world = comm->world_size();
  const int rank = comm->rank();

  std::vector<float> data(n);
  for (int iter = 0; iter < absl::GetFlag(FLAGS_iters); ++iter) {
    for (int64_t i = 0; i < n; ++i) data[i] = Pattern(rank, i, iter);
    RETURN_IF_ERROR(comm->AllReduceSum(data.data(), n));
    for (int64_t i = 0; i < n; ++i) {
      if (data[i] != ExpectedSum(world, i, iter)) {
        return absl::DataLossError(absl::StrFormat(
            "round %d: element %d is %g, expected %g", iter, i, data[i], ExpectedSum(world, i, iter)));
      }
    }
  }

  const int root = world - 1;
  std::vector<uint8_t> bytes(n, 0);
  if (rank == root) {
    for (int64_t i = 0; i < n; ++i) bytes[i] = BroadcastByte(i);
  }
  RETURN_IF_ERROR(comm->Broadcast(bytes.data(), n, root));
  for (int64_t i = 0; i < n; ++i) {
    if (bytes[i] != BroadcastByte(i)) {
      return absl::DataLossError(absl::StrFormat("broadcast byte %d is %d, expected %d", i,
                                                 bytes[i], BroadcastByte(i)));
    }
  }
  return comm->Barrier();
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = chunkattn::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "chunkattn-gloo-check rank %d: %s\n", absl::GetFlag(FLAGS_rank),
                 status.ToString().c_str());
    return 1;
  }
  std::printf("gloo ok rank %d\n", absl::GetFlag(FLAGS_rank));
  return 0;
}
