// Tensor-parallel all-reduce of GPU memory over NCCL, for the CUDA model
// (built when CUDA is). The same contract as Communicator (collectives are
// matched by order; a group that cannot complete reports an error, never
// hangs; after a failure it is broken), with device buffers and a stream:
//  - AllReduceSum only enqueues; completion (or a peer's failure) shows when
//    the caller waits for the stream through Wait(), which polls NCCL's
//    asynchronous error and gives up after the timeout by aborting the
//    communicator (UNAVAILABLE / DEADLINE_EXCEEDED).
//  - The unique id that names the group is made by rank 0 (MakeUniqueId: it
//    opens NCCL's bootstrap socket in rank 0's process) and reaches the other
//    ranks through the session's rendezvous store.
//  - The communicator is non-blocking (ncclConfig blocking = 0) so that
//    joining a group whose peer never comes also times out.
//
// Thread-compatible: one thread (the worker's) calls it. AllReduceSum may be
// captured in a CUDA graph.
#ifndef CHUNKATTN_WORKERS_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define CHUNKATTN_WORKERS_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace chunkattn {

class NcclCommunicator {
 public:
  // A fresh group id (NCCL_UNIQUE_ID_BYTES bytes). Call on rank 0 only.
  static absl::StatusOr<std::string> MakeUniqueId();

  // Joins group `id` as `rank` of `world_size` on CUDA device `device`.
  // INVALID_ARGUMENT for a malformed id or rank; DEADLINE_EXCEEDED when the
  // group is not complete within `timeout`; UNAVAILABLE for NCCL failures.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(int rank, int world_size,
                                                                  const std::string& id, int device,
                                                                  absl::Duration timeout);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  absl::Duration timeout() const { return timeout_; }
  // After a failure or a timeout: every call fails, the group must be rebuilt.
  bool broken() const { return broken_; }

  // Enqueues data[k] = sum over ranks of data[k] on `stream`; data is (n)
  // fp32 on this rank's device. n == 0 is a no-op.
  absl::Status AllReduceSum(float* data, int64_t n, cudaStream_t stream);

  // Waits for `stream` (everything enqueued so far, collectives included)
  // within the timeout, watching for NCCL errors. After an error or a
  // timeout the communicator is aborted and every later call fails.
  absl::Status Wait(cudaStream_t stream);

 private:
  NcclCommunicator(int rank, int world_size, absl::Duration timeout)
      : rank_(rank), world_size_(world_size), timeout_(timeout) {}
  // Polls a non-blocking call to completion (ncclInProgress) and maps errors.
  absl::Status Settle(int result, const char* what);
  absl::Status Broken();
  // Marks the group broken and aborts it (NCCL kernels waiting on a dead
  // peer return).
  void Abort(std::string reason);

  int rank_;
  int world_size_;
  absl::Duration timeout_;
  void* comm_ = nullptr;  // ncclComm_t, kept opaque so users need no nccl.h
  bool broken_ = false;
  std::string broken_reason_;
  cudaEvent_t done_ = nullptr;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_COLLECTIVES_NCCL_COMMUNICATOR_H_
