#include "workers/collectives/nccl_communicator.h"

#include <nccl.h>

#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kernels/cuda/cuda_status.h"

namespace chunkattn {
namespace {

using cuda::CudaStatus;

ncclComm_t Comm(void* p) { return static_cast<ncclComm_t>(p); }

}  // namespace

absl::StatusOr<std::string> NcclCommunicator::MakeUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    return absl::UnavailableError(absl::StrFormat("ncclGetUniqueId: %s", ncclGetErrorString(r)));
  }
  return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(int rank, int world_size,
                                                                            const std::string& id,
                                                                            int device,
                                                                            absl::Duration timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d of %d", rank, world_size));
  }
  if (id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrFormat("an NCCL unique id has %d bytes, got %d", NCCL_UNIQUE_ID_BYTES, id.size()));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaStatus(e, "cudaSetDevice");
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(rank, world_size, timeout));
  if (cudaError_t e = cudaEventCreateWithFlags(&c->done_, cudaEventDisableTiming); e != cudaSuccess) {
    return CudaStatus(e, "cudaEventCreate");
  }
  ncclUniqueId uid;
  std::copy(id.begin(), id.end(), uid.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, uid, rank, &config);
  c->comm_ = comm;
  absl::Status s = c->Settle(r, "ncclCommInitRankConfig");
  if (!s.ok()) return s;
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr && !broken_) {
    // Finalize flushes outstanding work; on a non-blocking communicator it
    // completes asynchronously, so poll it within the timeout.
    ncclResult_t r = ncclCommFinalize(Comm(comm_));
    const absl::Time deadline = absl::Now() + timeout_;
    while (r == ncclInProgress && absl::Now() < deadline) {
      std::this_thread::yield();
      if (ncclCommGetAsyncError(Comm(comm_), &r) != ncclSuccess) break;
    }
    if (r == ncclSuccess) {
      ncclCommDestroy(Comm(comm_));
      comm_ = nullptr;
    }
  }
  // A broken group, or one that did not finalize, may have kernels waiting
  // on a dead peer: abort, which also frees.
  if (comm_ != nullptr) ncclCommAbort(Comm(comm_));
  if (done_ != nullptr) cudaEventDestroy(done_);
}

void NcclCommunicator::Abort(std::string reason) {
  broken_ = true;
  broken_reason_ = std::move(reason);
  if (comm_ != nullptr) ncclCommAbort(Comm(comm_));
  comm_ = nullptr;
}

absl::Status NcclCommunicator::Broken() {
  return absl::UnavailableError("the NCCL group is broken: " + broken_reason_);
}

absl::Status NcclCommunicator::Settle(int result, const char* what) {
  ncclResult_t r = static_cast<ncclResult_t>(result);
  const absl::Time deadline = absl::Now() + timeout_;
  while (r == ncclInProgress && comm_ != nullptr) {
    if (absl::Now() > deadline) {
      Abort(absl::StrFormat("%s did not complete within %s", what, absl::FormatDuration(timeout_)));
      return absl::DeadlineExceededError(broken_reason_);
    }
    std::this_thread::yield();
    if (ncclCommGetAsyncError(Comm(comm_), &r) != ncclSuccess) break;
  }
  if (r == ncclSuccess) return absl::OkStatus();
  Abort(absl::StrFormat("%s: %s", what, ncclGetErrorString(r)));
  return absl::UnavailableError(broken_reason_);
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t n, cudaStream_t stream) {
  if (broken_) return Broken();
  if (n < 0 || (n > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(absl::StrFormat("AllReduceSum of %d floats at %p", n, data));
  }
  if (n == 0) return absl::OkStatus();
  return Settle(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, Comm(comm_), stream),
                "ncclAllReduce");
}

absl::Status NcclCommunicator::Wait(cudaStream_t stream) {
  if (broken_) return Broken();
  if (cudaError_t e = cudaEventRecord(done_, stream); e != cudaSuccess) {
    return CudaStatus(e, "cudaEventRecord");
  }
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return CudaStatus(q, "waiting for the step");
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(Comm(comm_), &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      Abort(absl::StrFormat("a collective failed: %s", ncclGetErrorString(async)));
      return absl::UnavailableError(broken_reason_);
    }
    if (absl::Now() > deadline) {
      Abort(absl::StrFormat("a step's collectives did not complete within %s", absl::FormatDuration(timeout_)));
      return absl::DeadlineExceededError(broken_reason_);
    }
    std::this_thread::yield();
  }
}

}  // namespace chunkattn
