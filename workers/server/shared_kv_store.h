// The shared KV tier on a worker (issue 41): this rank's shard of a chunk's
// KV in Redis (the coordinator's --kv_store_url, handed over at Join), where
// every replica serving the same model finds it: a prefix one replica
// computed is loaded by another instead of recomputed.
//
// Keys: KeyPrefix() + 16 hex digits of the block's chained hash (the KV
// events' hash: the cache namespace and every token up to the block's end,
// so tenants never share a key). The prefix names what makes two workers'
// bytes interchangeable: the model (its config and a sample of its weights
// as loaded, so a fine-tune of the same shape gets keys of its own), the
// weight and KV dtypes, the chunk size, the device kind, the attention
// implementation, and the tensor-parallel size and rank: each rank keeps its
// own shard under its own key.
//
// Values: the chunk's seal (kv_chunk_seal.h: magic, key, checksum, length;
// the host and disk tiers' too) then the bytes (Model::ReadChunk's). A Load
// checks all four against what it asked for, so a value that is missing,
// cut short, overwritten by another writer or corrupted fails (NOT_FOUND,
// DATA_LOSS) and the coordinator recomputes the chunk: never a wrong token.
//
// Stores are asynchronous: Store copies the bytes into a bounded queue that
// a writer thread of its own sends (SET with a TTL; Redis evicts by its own
// maxmemory policy too), so a slow Redis never lengthens a step; a full queue
// drops the block (RESOURCE_EXHAUSTED, a failed move). Loads are synchronous
// on the caller's thread, each bounded by the client's deadline; a Redis
// that is down fails them at once after the first (RedisClient's back-off).
//
// Thread-safety: Store and Load from one thread (the worker's Execute
// stream, through PlanExecutor); the writer thread is internal.
#ifndef CHUNKATTN_WORKERS_SERVER_SHARED_KV_STORE_H_
#define CHUNKATTN_WORKERS_SERVER_SHARED_KV_STORE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/redis_client.h"
#include "workers/model/model.h"
#include "workers/model/weights.h"
#include "workers/server/kv_chunk_seal.h"

namespace chunkattn {

struct SharedKvOptions {
  RedisUrl url;
  RedisOptions redis;
  // Each value's time to live (0: none): a prompt's KV does not outstay a
  // day in a store other replicas and operators can read.
  absl::Duration ttl = absl::Hours(24);
  int64_t max_queued_bytes = int64_t{64} << 20;  // stores waiting for the writer
};

// What makes two workers' KV bytes interchangeable, as a key prefix
// ("chunkattn:kv:v2:<16 hex>:r<rank>of<world>:"; v2 is the seal's layout
// version, kv_chunk_seal.h, so an older layout is never found). `device` is "cpu" or
// "cuda"; the weights are sampled (a few KiB of every matrix, at strides),
// not read whole.
std::string SharedKvKeyPrefix(const ModelConfig& config, const ModelWeights& weights, const ModelOptions& model,
                              std::string_view device, int rank, int world_size);

class SharedKvStore {
 public:
  static constexpr int64_t kHeaderBytes = KvChunkSeal::kBytes;  // a value's seal, before its chunk

  // Starts the writer; connects lazily (a Redis down at Join costs failed
  // moves, not the Join).
  SharedKvStore(SharedKvOptions options, std::string key_prefix, int64_t chunk_bytes);
  // Stops the writer; stores still queued are dropped.
  ~SharedKvStore();
  SharedKvStore(const SharedKvStore&) = delete;
  SharedKvStore& operator=(const SharedKvStore&) = delete;

  int64_t chunk_bytes() const { return chunk_bytes_; }
  const std::string& key_prefix() const { return key_prefix_; }
  std::string RedisKey(uint64_t key) const;

  // Queues `bytes` (chunk_bytes of them) for Redis under `key`.
  // INVALID_ARGUMENT for another size, RESOURCE_EXHAUSTED when the queue is
  // full (the block is not stored).
  absl::Status Store(uint64_t key, absl::Span<const uint8_t> bytes);
  // The bytes stored under `key` into `out` (chunk_bytes of them): NOT_FOUND
  // when Redis has none, DATA_LOSS naming what is wrong when the value's
  // size or its seal's magic, key, length or checksum does not match, the
  // client's codes when Redis is slow, down or refuses (`out` is then
  // unspecified).
  absl::Status Load(uint64_t key, absl::Span<uint8_t> out);
  // Blocks until every store queued so far was sent (or dropped): for tests.
  void Flush();

  struct Stats {
    int64_t stored = 0;        // values Redis took
    int64_t store_failed = 0;  // dropped: the queue full, or Redis refused or failed
  };
  Stats stats() const;

 private:
  void WriterLoop();
  bool WriterHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }
  bool Flushed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !writing_; }

  const SharedKvOptions options_;
  const std::string key_prefix_;
  const int64_t chunk_bytes_;
  RedisClient reader_;  // the caller's thread only

  mutable absl::Mutex mu_;
  struct Pending {
    std::string key;
    std::string value;
  };
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // the writer holds a store taken off the queue
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;  // last: starts once the rest is built
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SERVER_SHARED_KV_STORE_H_
