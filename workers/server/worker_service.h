// The compute worker's gRPC service (worker.proto): a session per Join (the
// model shard for its rank, on the CPU or a GPU, the collective group: Gloo,
// or NCCL on GPUs, whose unique id rank 0 makes and publishes in the
// session's rendezvous store; the KV budget), the plan
// stream that runs it, and the rendezvous store the group's ranks meet
// through (rank 0's is used).
//
// Trust: with a worker token every RPC but health is authenticated (the
// transport, TLS or mutual TLS, is the server's, set up in worker_main); a worker
// serves one coordinator (JoinRequest.coordinator) while that one is live and
// refuses others; models load only from under --model_root; the store is
// bounded (keys, bytes, waiters), so no caller can grow this process without
// limit.
//
// Threads: gRPC's sync server threads call the handlers. One Execute stream
// runs at a time per session and drives the model from its handler thread;
// a Join replaces the session (after a peer died the coordinator re-joins
// every rank), and an Execute still running on the old one ends with
// ABORTED at its next plan. The store is guarded by its own mutex.
#ifndef CHUNKATTN_WORKERS_SERVER_WORKER_SERVICE_H_
#define CHUNKATTN_WORKERS_SERVER_WORKER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/device.h"
#include "base/grpc_security.h"
#include "chunkattn/internal/v1/worker.grpc.pb.h"
#include "base/thread_pool.h"
#include "workers/model/weights.h"
#include "workers/server/kv_tier_store.h"

namespace gloo::rendezvous {
class Store;
}  // namespace gloo::rendezvous

namespace chunkattn {

struct WorkerOptions {
  DeviceSpec device;                  // cpu, or the CUDA device (builds with CUDA only)
  int threads = 0;                    // CPU attention threads; 0 = one per core
  // This rank's KV pool budget; 0 = 1 GiB on CPU, on GPU what
  // gpu_memory_fraction leaves after the weights and workspace.
  int64_t kv_cache_bytes = 0;
  double gpu_memory_fraction = 0.9;   // of the device's memory this process may use
  bool cuda_graphs = true;            // replay decode steps from CUDA graphs
  // What this rank keeps its weight matrices in (a GPU converts what it
  // uploads to its dtype; int8 is CPU-only).
  WeightDType weight_dtype = WeightDType::kAuto;
  std::string collective_host = "127.0.0.1";  // the address peers reach this rank's collectives at
  TokenAuth auth;          // the worker token every caller (coordinator, peers) must send
  std::string model_root;  // Join's model must resolve under it; empty = anywhere
  // How this rank calls rank 0's rendezvous store: plaintext, or TLS with
  // this worker's own certificate as its client certificate.
  ChannelSecurity peer_channel;
  // The KV tiers below this rank's pool (issue 41; all off by default),
  // made empty at every Join and reported in its response.
  KvTierOptions kv_tiers;
};

// The store's bounds: far above what a rendezvous needs (a few small keys per
// rank), far below what would hurt the process.
inline constexpr int kMaxStoreKeys = 4096;
inline constexpr int kMaxStoreKeyBytes = 1024;
inline constexpr int kMaxStoreValueBytes = 1 << 20;
inline constexpr int64_t kMaxStoreBytes = int64_t{64} << 20;
inline constexpr int kMaxStoreWaiters = 64;       // StoreGet calls waiting at once
inline constexpr int kMaxStoreKeysPerGet = 256;

// How long a coordinator holds a worker after its Join without a plan stream.
inline constexpr int kJoinLeaseSeconds = 60;

class WorkerService final : public internal::v1::Worker::Service {
 public:
  explicit WorkerService(const WorkerOptions& options);
  ~WorkerService() override;

  grpc::Status Join(grpc::ServerContext* context, const internal::v1::JoinRequest* request,
                    internal::v1::JoinResponse* response) override;
  grpc::Status Execute(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<internal::v1::StepResult, internal::v1::StepPlan>* stream) override;
  grpc::Status StoreSet(grpc::ServerContext* context, const internal::v1::StoreSetRequest* request,
                        internal::v1::StoreSetResponse* response) override;
  grpc::Status StoreGet(grpc::ServerContext* context, const internal::v1::StoreGetRequest* request,
                        internal::v1::StoreGetResponse* response) override;

  // Graceful shutdown (SIGTERM): from now on Join and the store refuse with
  // UNAVAILABLE and every step result says `draining`, while the plan stream
  // is served on, so the coordinator finishes its running requests and then
  // releases this worker by closing the stream.
  void BeginDrain();
  // True once no plan stream is open (released, or none was), false when
  // `timeout` passed first. Blocks the caller.
  bool AwaitReleased(absl::Duration timeout);

 private:
  struct Session;

  // Refuses a Join by another coordinator while the owner is live, else makes
  // the caller the owner. `joining` counts Joins in flight (they hold it).
  grpc::Status ClaimOwnership(const std::string& coordinator);
  static grpc::Status Draining();
  // The GPU half of Join: the device group, the model on the device, the KV
  // capacity (FAILED_PRECONDITION in a build without CUDA: gpu_model.h).
  grpc::Status JoinGpu(const internal::v1::JoinRequest& req, Session* session,
                       const std::shared_ptr<gloo::rendezvous::Store>& store, uint32_t timeout_ms,
                       int64_t chunk_bytes);

  WorkerOptions options_;
  ThreadPool pool_;
  std::string device_name_;  // reported at Join: "cpu", "cuda:0 (NVIDIA H100 ...)"

  std::atomic<bool> draining_{false};
  absl::Mutex mu_;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  std::string owner_ ABSL_GUARDED_BY(mu_);  // the coordinator served; empty = none yet
  absl::Time owner_lease_end_ ABSL_GUARDED_BY(mu_);
  int joins_in_flight_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex store_mu_;
  absl::CondVar store_cv_;  // signalled on every StoreSet
  std::map<std::string, std::string> store_ ABSL_GUARDED_BY(store_mu_);
  int64_t store_bytes_ ABSL_GUARDED_BY(store_mu_) = 0;
  int store_waiters_ ABSL_GUARDED_BY(store_mu_) = 0;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SERVER_WORKER_SERVICE_H_
