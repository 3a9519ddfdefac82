// Gloo over TCP: the communicator for tensor-parallel ranks in separate
// worker processes (one per GPU, or CPU workers on one host).
//
// Rendezvous: each rank publishes its TCP address under `prefix` in a
// gloo::rendezvous::Store and reads the others', then every pair connects
// (full mesh). AllReduceSum is Gloo's ring all-reduce, so every element's sum
// is computed on one rank and copied to the rest: bit-identical on every
// rank. The summation order is the ring's, so with three or more ranks the
// rounding may differ from the in-process group's fixed rank order; with two
// ranks (a + b == b + a) the results are equal bit for bit.
//
// Errors: Gloo throws; every call here catches and maps its errors
// (timeouts to DEADLINE_EXCEEDED, closed or refused connections to
// UNAVAILABLE), and the communicator is then broken (communicator.h).
#ifndef CHUNKATTN_WORKERS_COLLECTIVES_GLOO_COMMUNICATOR_H_
#define CHUNKATTN_WORKERS_COLLECTIVES_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "workers/collectives/communicator.h"

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace chunkattn {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // A directory every rank can see, for gloo's FileStore rendezvous. Unused
  // by the overload that takes a Store.
  std::string store_path;
  // Namespaces the store keys (e.g. a job id). Keys are written once: a
  // second group in the same directory needs a different prefix (FileStore
  // fails on an existing key).
  std::string prefix = "chunkattn";
  // The address this rank listens on; peers connect to it.
  std::string interface_host = "127.0.0.1";
  // Bounds the rendezvous (waiting for peers' addresses and connections)
  // and each collective. FileStore checks it in whole seconds, so the
  // rendezvous may take up to a second longer.
  absl::Duration timeout = absl::Seconds(30);
};

// Connects rank `options.rank` of a FileStore group rooted at
// options.store_path. Blocks until all world_size ranks have connected or
// the timeout passes (DEADLINE_EXCEEDED).
// INVALID_ARGUMENT: world_size < 1, rank outside [0, world_size), timeout
// not positive, store_path not an existing directory, empty
// interface_host.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(const GlooOptions& options);

// As above, with the rendezvous through `store` (e.g. one the coordinator
// backs); options.store_path is ignored. `store` is used only during this
// call. REQUIRES: store != nullptr (else INVALID_ARGUMENT).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    const GlooOptions& options, std::shared_ptr<gloo::rendezvous::Store> store);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_COLLECTIVES_GLOO_COMMUNICATOR_H_
