// The compute worker's gRPC service (worker.proto): a session per Join (the
// model shard for its rank, the collective group, the KV budget), the plan
// stream that runs it, and the rendezvous store the group's ranks meet
// through (rank 0's is used).
//
// Threads: gRPC's sync server threads call the handlers. One Execute stream
// runs at a time per session and drives the model from its handler thread;
// a Join replaces the session (after a peer died the coordinator re-joins
// every rank), and an Execute still running on the old one ends with
// ABORTED at its next plan. The store is guarded by its own mutex.
#ifndef CHUNKATTN_WORKERS_SERVER_WORKER_SERVICE_H_
#define CHUNKATTN_WORKERS_SERVER_WORKER_SERVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "chunkattn/internal/v1/worker.grpc.pb.h"
#include "kernels/cpu/thread_pool.h"

namespace chunkattn {

struct WorkerOptions {
  std::string device = "cpu";
  int threads = 0;                    // attention threads; 0 = one per core
  int64_t kv_cache_bytes = int64_t{1} << 30;  // this rank's KV pool budget
  std::string collective_host = "127.0.0.1";  // the address peers reach this rank's collectives at
};

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

 private:
  struct Session;

  WorkerOptions options_;
  cpu::ThreadPool pool_;

  absl::Mutex mu_;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);

  absl::Mutex store_mu_;
  absl::CondVar store_cv_;  // signalled on every StoreSet
  std::map<std::string, std::string> store_ ABSL_GUARDED_BY(store_mu_);
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SERVER_WORKER_SERVICE_H_
