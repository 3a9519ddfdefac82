// KV-cache events in vLLM's wire format (vllm/distributed/kv_events.py), made
// from the prefix forest's block events: what routers with precise prefix
// scoring (llm-d's endpoint picker, SMG, Dynamo) index to send a prompt to
// the replica that holds its prefix. Design and sources:
// docs/design/kv-events.md.
//
// The projection: the forest's node at depth k holds positions
// [k*C, (k+1)*C) of its sequences (C = --chunk_size), so a node *is* vLLM's
// block k, aligned to the start of the sequence. A block is stored when its
// chunk is full and every token's KV is computed, and removed when the chunk
// is freed (evicted); partial chunks are never reported. Identical full
// siblings hash alike and are each stored and removed once, as in vLLM
// (consumers count references). Hashes: block_hash.h.
//
// The KV tiers under the pool (services/core/kv_tiers.h) are reported too,
// each as its own `medium`, as vLLM's offloading connector reports its CPU
// tier: a block kept in a tier is a BlockStored of that medium (no parent,
// no token ids: its hash is the one the pool published, the tiers being keyed
// by it), and one the tier forgets a BlockRemoved. A router that counts a
// block in any medium as a hit (Dynamo) so sees the tiers.
#ifndef CHUNKATTN_SERVICES_KV_EVENTS_KV_EVENTS_H_
#define CHUNKATTN_SERVICES_KV_EVENTS_KV_EVENTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "services/core/prefix_forest.h"
#include "services/kv_events/block_hash.h"

namespace chunkattn {

// Where an event's blocks are (KvEvent::tier): 0 the pool; the tiers below
// it are numbered as KvTier (proto/plan/step_plan.h): 1 host, 2 disk, 3 the
// shared store.
inline constexpr int kKvPoolTier = 0;
inline constexpr int kKvMaxTier = 3;
// The tier's name on the wire (vLLM's `medium`): the pool is `pool_medium`
// (the publisher's, "GPU", also on CPU workers, as consumers name vLLM's
// primary tier), host "CPU" and disk "STORAGE" (vLLM's MEDIUM_CPU and
// MEDIUM_STORAGE), the shared store "SHARED" (ours: vLLM has no store shared
// by replicas). "" for a number outside [0, kKvMaxTier].
std::string_view KvTierMedium(int tier, std::string_view pool_medium);

struct KvEvent {
  enum class Kind : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };
  Kind kind = Kind::kBlockStored;
  int tier = kKvPoolTier;  // stored, removed: a tier's BlockStored has no parent and no token ids
  std::vector<uint64_t> block_hashes;  // stored, removed
  // kBlockStored: a run of blocks of one path, parent first.
  std::optional<uint64_t> parent_block_hash;  // none: the run starts at block 0
  std::vector<int32_t> token_ids;             // the run's tokens, block_size per block
  int32_t block_size = 0;
  std::string cache_salt;  // the run starts at block 0 of this namespace ("" : none)
};

// One publication: the events of one engine step.
struct KvEventBatch {
  uint64_t seq = 0;  // from 0, +1 per batch
  double ts = 0;     // seconds since the epoch
  std::vector<KvEvent> events;
};

// The encodings of vLLM's msgspec structs. kMap: vLLM >= 0.26 (each event a
// map with "type"); kArray: older vLLM (each event an array, tag first). The
// batch itself is [ts, events, data_parallel_rank] in both.
enum class KvEventFormat { kMap, kArray };
absl::StatusOr<KvEventFormat> ParseKvEventFormat(std::string_view name);

// The msgpack payload of `batch`; `medium` is the pool's storage tier (an
// event of a tier below it carries that tier's: KvTierMedium).
std::string EncodeKvEventBatch(const KvEventBatch& batch, KvEventFormat format, std::string_view medium);

// Turns the forest's block events into KV events, keeping each stored block's
// digest for its children and its removal. Loop thread only (the forest's).
class KvEventTracker {
 public:
  KvEventTracker(int block_size, std::string hash_seed);

  // Appends the events of `blocks` (PrefixForest::TakeBlockEvents, in order)
  // to `out`: each run of stored blocks down one path as one BlockStored, each
  // run of removals as one BlockRemoved. A block whose parent was never
  // stored is skipped (the forest guarantees it is not).
  void Convert(std::vector<BlockEvent> blocks, std::vector<KvEvent>* out);
  // Every block is gone (a new cache): appends AllBlocksCleared.
  void Clear(std::vector<KvEvent>* out);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }

 private:
  struct Entry {
    BlockDigest digest;
    uint64_t hash;
  };
  const int block_size_;
  const BlockDigest none_;
  absl::flat_hash_map<ChunkId, Entry> blocks_;
};

// Every block of `forest` now, computed from the tree alone (not from any
// tracker): its namespace and published hash, in chunk order. For
// introspection (ListKvBlocks) and tests.
struct KvBlockInfo {
  std::string ns;
  uint64_t hash = 0;
  ChunkId chunk = 0;
};
std::vector<KvBlockInfo> ListBlocks(const PrefixForest& forest, std::string_view hash_seed);

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_KV_EVENTS_KV_EVENTS_H_
