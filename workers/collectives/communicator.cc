#include "workers/collectives/communicator.h"

#include "absl/strings/str_format.h"
#include "workers/collectives/internal.h"

namespace chunkattn {
namespace collectives_internal {

absl::Status CheckAllReduceArgs(const float* data, int64_t n) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("AllReduceSum: n = %d < 0", n));
  }
  if (n > 0 && data == nullptr) {
    return absl::InvalidArgumentError("AllReduceSum: data is null");
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcastArgs(const void* data, int64_t bytes, int root,
                                int world_size) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("Broadcast: bytes = %d < 0", bytes));
  }
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError("Broadcast: data is null");
  }
  if (root < 0 || root >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Broadcast: root %d outside [0, %d)", root, world_size));
  }
  return absl::OkStatus();
}

}  // namespace collectives_internal

namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }

  absl::Status AllReduceSum(float* data, int64_t n) override {
    return collectives_internal::CheckAllReduceArgs(data, n);
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    return collectives_internal::CheckBroadcastArgs(data, bytes, root, 1);
  }

  absl::Status Barrier() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace chunkattn
