// Asks the shared KV tier (Redis; issue 41) which leading blocks of a new
// request's prompt it holds, on a thread of its own, so that the engine loop
// never waits on the store: the loop queues a probe when a request arrives
// (Scheduler::AwaitSharedProbe holds its admission back, for a bounded
// time), and the answer comes back through a callback that the engine posts
// to its loop (Scheduler::SharedProbeDone), which then plans loads from the
// shared tier instead of the prefill.
//
// A block is found when every rank's shard of it is there: one EXISTS over
// the ranks' keys (each worker's kv_store_key_prefix and the block's chained
// hash, as the workers store them), the prompt's blocks pipelined, and the
// probes queued meanwhile in the same round trip. A probe queued longer than
// max_wait, or one whose round fails (Redis slow, down, refusing), is
// answered with no block: the request is prefilled as without the tier.
//
// Thread-safe: Probe and SetKeyPrefixes from any thread (the engine loop's);
// `done` runs on the probe's thread.
#ifndef CHUNKATTN_SERVICES_CORE_SHARED_KV_PROBE_H_
#define CHUNKATTN_SERVICES_CORE_SHARED_KV_PROBE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/redis_client.h"

namespace chunkattn {

struct SharedKvProbeOptions {
  RedisUrl url;
  RedisOptions redis;  // its io_timeout bounds one round of probes
  int chunk_size = 0;
  std::string block_hash_seed = "0";  // the KV events' seed: the workers' keys
  absl::Duration max_wait = absl::Milliseconds(100);  // a probe queued longer gets no block, unasked
  int max_blocks_per_round = 4096;  // EXISTS commands in one pipelined round trip
};

struct SharedKvProbeStats {
  int64_t probes_total = 0;
  int64_t blocks_found_total = 0;
  int64_t failed_total = 0;  // probes answered empty for a slow, down or refusing store
};

class SharedKvProbe {
 public:
  // The leading blocks of request `id`'s prompt that the store holds, their
  // keys in block order (empty: none, or the store did not answer in time).
  using Done = std::function<void(int64_t id, std::vector<uint64_t> keys)>;

  SharedKvProbe(SharedKvProbeOptions options, Done done);
  // Stops the thread; probes still queued are not answered.
  ~SharedKvProbe();
  SharedKvProbe(const SharedKvProbe&) = delete;
  SharedKvProbe& operator=(const SharedKvProbe&) = delete;

  // Per rank, the prefix of its keys (WorkerGroup::kv_store_key_prefixes),
  // for the probes from now on; empty: every probe is answered empty.
  void SetKeyPrefixes(std::vector<std::string> prefixes);
  // Queues a probe of the full blocks of `prompt` before its last token (the
  // prefill computes that one whatever the cache holds), in cache namespace
  // `ns`.
  void Probe(int64_t id, std::vector<int32_t> prompt, std::string ns);

  SharedKvProbeStats stats() const;

 private:
  struct Pending {
    int64_t id = 0;
    std::vector<int32_t> prompt;
    std::string ns;
    absl::Time queued;
  };
  void Loop();
  // One round: the probes' blocks in one pipeline; calls done_ for each.
  void Round(std::vector<Pending> batch, const std::vector<std::string>& prefixes, RedisClient* client);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  const SharedKvProbeOptions options_;
  const Done done_;
  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> prefixes_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  SharedKvProbeStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_SHARED_KV_PROBE_H_
