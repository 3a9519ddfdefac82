#include "workers/collectives/in_process_group.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "workers/collectives/internal.h"

namespace chunkattn {
namespace {

enum class OpKind { kAllReduceSum, kBroadcast, kBarrier };

const char* OpName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduceSum: return "AllReduceSum";
    case OpKind::kBroadcast: return "Broadcast";
    case OpKind::kBarrier: return "Barrier";
  }
  return "?";
}

// One rank's side of a collective, published for the others to read.
struct Call {
  OpKind kind = OpKind::kBarrier;
  void* data = nullptr;
  int64_t size = 0;  // floats for AllReduceSum, bytes for Broadcast
  int root = 0;
};

// Elements summed per block: the partial sums stay in L1 while each rank's
// block is added in, and the adds vectorize. Blocking does not change the
// per-element order of the additions.
constexpr int64_t kSumBlock = 512;

class GroupState {
 public:
  GroupState(int world_size, absl::Duration timeout)
      : world_size_(world_size), timeout_(timeout), calls_(world_size) {}

  int world_size() const { return world_size_; }

  // Runs one collective for `rank`: publish `call`, barrier, do this rank's
  // share of the work on the published buffers, barrier.
  absl::Status Run(int rank, const Call& call) {
    {
      absl::MutexLock lock(&mu_);
      calls_[rank] = call;
      RETURN_IF_ERROR(ArriveLocked(rank, /*first=*/true));
    }
    // calls_ is stable until every rank has passed the second barrier, and
    // between the barriers each buffer element is touched by one rank only.
    const absl::Status agreed = CheckAgreement();
    if (agreed.ok()) Work(rank);
    absl::Status done;
    {
      absl::MutexLock lock(&mu_);
      if (--working_ == 0) cv_.SignalAll();
      done = ArriveLocked(rank, /*first=*/false);
      if (!done.ok()) {
        // The group broke while some rank may still be summing into (or
        // copying from) this rank's buffer. That work never blocks, so wait
        // for it rather than hand the buffer back while it is in use.
        while (working_ > 0) cv_.Wait(&mu_);
      }
    }
    RETURN_IF_ERROR(done);
    return agreed;
  }

 private:
  // Waits until all ranks have arrived at this barrier, the group breaks,
  // or the timeout passes (which breaks the group).
  absl::Status ArriveLocked(int rank, bool first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!broken_.ok()) return broken_;
    const uint64_t generation = generation_;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      // Set together with the release so no rank can see the barrier passed
      // while the count of ranks still working is stale.
      if (first) working_ = world_size_;
      cv_.SignalAll();
      return absl::OkStatus();
    }
    const absl::Time deadline = absl::Now() + timeout_;
    while (generation_ == generation && broken_.ok()) {
      const bool timed_out = cv_.WaitWithDeadline(&mu_, deadline);
      if (timed_out && generation_ == generation && broken_.ok()) {
        const std::string what = absl::StrFormat(
            "in-process group: rank %d waited %s for %d other rank(s) in %s", rank,
            absl::FormatDuration(timeout_), world_size_ - arrived_, OpName(calls_[rank].kind));
        broken_ = absl::UnavailableError(absl::StrCat("group broken earlier: ", what));
        cv_.SignalAll();
        return absl::DeadlineExceededError(what);
      }
    }
    if (generation_ != generation) return absl::OkStatus();
    return broken_;
  }

  absl::Status CheckAgreement() const {
    const Call& c0 = calls_[0];
    for (int r = 1; r < world_size_; ++r) {
      const Call& c = calls_[r];
      if (c.kind != c0.kind || c.size != c0.size || c.root != c0.root) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "in-process group: ranks disagree: rank 0 called %s(size %d, root %d), "
            "rank %d called %s(size %d, root %d)",
            OpName(c0.kind), c0.size, c0.root, r, OpName(c.kind), c.size, c.root));
      }
    }
    return absl::OkStatus();
  }

  void Work(int rank) const {
    const Call& c0 = calls_[0];
    switch (c0.kind) {
      case OpKind::kAllReduceSum: {
        const int64_t n = c0.size;
        const int64_t begin = n * rank / world_size_;
        const int64_t end = n * (rank + 1) / world_size_;
        float sum[kSumBlock];
        for (int64_t b = begin; b < end; b += kSumBlock) {
          const int64_t len = std::min(kSumBlock, end - b);
          const float* x0 = static_cast<const float*>(calls_[0].data) + b;
          for (int64_t i = 0; i < len; ++i) sum[i] = x0[i];
          for (int r = 1; r < world_size_; ++r) {
            const float* x = static_cast<const float*>(calls_[r].data) + b;
            for (int64_t i = 0; i < len; ++i) sum[i] += x[i];
          }
          for (int r = 0; r < world_size_; ++r) {
            std::memcpy(static_cast<float*>(calls_[r].data) + b, sum, len * sizeof(float));
          }
        }
        break;
      }
      case OpKind::kBroadcast:
        if (rank != c0.root) {
          std::memcpy(calls_[rank].data, calls_[c0.root].data, c0.size);
        }
        break;
      case OpKind::kBarrier:
        break;
    }
  }

  const int world_size_;
  const absl::Duration timeout_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Ranks between the first and second barrier of the current collective.
  int working_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // Written by rank r under mu_ before the first barrier; read without mu_
  // by every rank between the barriers (the barrier orders the accesses).
  std::vector<Call> calls_;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<GroupState> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }

  absl::Status AllReduceSum(float* data, int64_t n) override {
    RETURN_IF_ERROR(collectives_internal::CheckAllReduceArgs(data, n));
    if (n == 0) return absl::OkStatus();
    if (world_size() == 1) return absl::OkStatus();
    return group_->Run(rank_, Call{OpKind::kAllReduceSum, data, n, 0});
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    RETURN_IF_ERROR(collectives_internal::CheckBroadcastArgs(data, bytes, root, world_size()));
    if (bytes == 0) return absl::OkStatus();
    if (world_size() == 1) return absl::OkStatus();
    return group_->Run(rank_, Call{OpKind::kBroadcast, data, bytes, root});
  }

  absl::Status Barrier() override {
    if (world_size() == 1) return absl::OkStatus();
    return group_->Run(rank_, Call{OpKind::kBarrier, nullptr, 0, 0});
  }

 private:
  const std::shared_ptr<GroupState> group_;
  const int rank_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> MakeInProcessGroup(
    int world_size, absl::Duration timeout) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MakeInProcessGroup: world_size %d < 1", world_size));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("MakeInProcessGroup: timeout must be positive");
  }
  auto group = std::make_shared<GroupState>(world_size, timeout);
  std::vector<std::unique_ptr<Communicator>> ranks;
  ranks.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(std::make_unique<InProcessCommunicator>(group, r));
  }
  return ranks;
}

}  // namespace chunkattn
