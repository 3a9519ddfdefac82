// The KV tiers under the prefix forest: where a block (a full chunk of
// computed KV) lives below the worker's pool once the pool evicted it, so a
// later prompt with the same prefix loads it instead of recomputing it. The
// tiers are the workers' host memory, then their local disk; each is an
// array of chunk-sized slots on every rank (each rank keeps its own shard).
// The coordinator owns this map as it owns the forest; the workers only move
// bytes (StepPlan::moves) and check them.
//
// Blocks are keyed by their chained hash (the KV events' hash, block_hash.h:
// the namespace, every token before the block and its own), so a key names
// the same KV wherever it is computed, and tenants never share one.
//
// The shared tier (Redis, shared by replicas; issue 41) has no slots: the
// map keeps a bounded set of keys it believes the store holds (those stored
// by this replica's workers, and those a probe found: SharedKvProbe), and
// the store evicts by its own policy, so a belief may be stale: the load
// then fails and the block is recomputed, and forgotten. A block kept in a
// tier for the first time is also written to the shared tier (write-through
// to the store: a replica's blocks reach the others as soon as this
// replica keeps them, and a block the host or disk tier later drops is
// still there); with no host or disk tier it goes to the shared tier only.
//
// A block evicted from the pool enters the host tier (write-back), or the
// disk tier when there is no host tier. A full host tier demotes its victim
// to disk (dropped without a disk tier); a full disk tier drops its victim.
// Retention (retention.h) holds here as in the pool: a block keeps its
// grants down the tiers, a tier's victim is its lowest priority block, the
// least recently used within a priority, and a block never displaces one
// of higher priority: it goes to the disk tier instead, or is dropped. The
// grants live in one place at a time: a load hands them back to the pool
// with the block (the tier's copy keeps none), an eviction hands them down
// again, so a tenant's raised blocks are counted once across pool and
// tiers (RaisedPerNamespace; the per-tenant bound, scheduler.h). A
// slot that a load of the step in flight reads is pinned until Complete, so
// no later move of that step overwrites it. A failed move (a full disk, a
// corrupt or missing slot) forgets its block: the next prompt recomputes it.
//
// Not thread-safe: owned by the scheduler (the engine loop's thread).
#ifndef CHUNKATTN_SERVICES_CORE_KV_TIERS_H_
#define CHUNKATTN_SERVICES_CORE_KV_TIERS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "proto/plan/step_plan.h"
#include "services/core/lru_eviction.h"
#include "services/core/retention.h"
#include "services/kv_events/block_hash.h"

namespace chunkattn {

struct KvTierMapOptions {
  int64_t host_slots = 0;  // blocks the host tier holds (the smallest rank's); 0: none
  int64_t disk_slots = 0;  // blocks the disk tier holds; 0: none
  bool shared = false;     // the workers have a shared tier (Redis)
  int64_t shared_known_max = int64_t{1} << 20;  // keys believed in the shared tier, at most (16 B each)
  bool record_events = false;  // keep KvTierEvents for TakeEvents (the KV events)
  const Clock* clock = nullptr;  // borrowed: when retention grants end (null: the wall clock)
};

// A block entering or leaving a tier, as the map decides it (the plan's move
// may still fail: its block then leaves again at Complete). The KV events
// report it with the tier as its medium (kv_events.h). For the shared tier:
// a key the map starts or stops believing in.
struct KvTierEvent {
  KvTier tier = KvTier::kHost;
  bool stored = true;  // false: removed
  uint64_t key = 0;
};

struct KvTierStats {
  int64_t host_blocks = 0;  // slots holding a block now
  int64_t disk_blocks = 0;
  int64_t stores_total = 0;     // blocks written down from the pool
  int64_t demotions_total = 0;  // host -> disk
  int64_t drops_total = 0;      // blocks a full tier forgot
  int64_t drops_by_band_total[kNumRetentionBands] = {};  // of those, by retention band
  int64_t host_loads_total = 0;  // blocks loaded back into the pool, by tier
  int64_t disk_loads_total = 0;
  int64_t failed_moves_total = 0;  // host or disk moves a worker reported failed (the block is forgotten)
  int64_t host_failed_moves_total = 0;  // of which the host tier's (a demotion counts as the disk's)
  int64_t host_drops_total = 0;         // of drops_total, the host tier's (no disk tier below it)
  int64_t host_written_total = 0;       // blocks written into the host tier
  int64_t disk_written_total = 0;       // into the disk tier: stores and demotions
  // The shared tier.
  int64_t shared_known = 0;               // keys believed in the store now
  int64_t shared_stores_total = 0;        // blocks written to it
  int64_t shared_hits_total = 0;          // blocks a probe found there (not known before)
  int64_t shared_loads_total = 0;         // blocks loaded from it into the pool
  int64_t shared_fallbacks_total = 0;     // loads that failed (missing, corrupt, slow, down): recomputed
  int64_t shared_failed_stores_total = 0;  // stores a worker could not queue or send
};

class KvTierMap {
 public:
  struct Location {
    KvTier tier = KvTier::kHost;
    int64_t slot = 0;
  };

  explicit KvTierMap(KvTierMapOptions options);

  bool enabled() const { return host_.capacity > 0 || disk_.capacity > 0 || shared_; }
  bool shared() const { return shared_; }
  bool empty() const { return where_.empty() && shared_known_.empty(); }

  // The slot holding block `key`, if the host or disk tier has it; else the
  // shared tier (slot 0) when the map believes it holds the block.
  std::optional<Location> Find(uint64_t key) const;

  // A probe found `keys` in the shared tier: they may be loaded from now.
  void NoteShared(absl::Span<const uint64_t> keys);

  // Block `key` of namespace `ns` in pool chunk `chunk` is about to leave
  // the pool: keeps it in the highest tier with room for its priority
  // (`grants`, its retention; null: none), appending the moves (a demotion
  // or a drop to make room, then the store). A block already kept is only
  // refreshed (and given `grants`). Nothing happens when every slot is
  // pinned or of higher priority.
  void Keep(uint64_t key, int32_t chunk, std::vector<KvMove>* moves, const RetentionGrants* grants = nullptr,
            std::string_view ns = {});
  // The retention priority now of a block the host or disk tier holds (the
  // default otherwise).
  int32_t Priority(uint64_t key) const;

  // Loads block `key` (REQUIRES: Find(key)) into pool chunk `chunk`:
  // appends the move, refreshes the block and pins its slot (a shared
  // tier's load pins nothing: the store is not ours to overwrite). Returns
  // the block's grants, which go to the pool with it: the tier's copy
  // falls to the default priority.
  RetentionGrants Load(uint64_t key, int32_t chunk, std::vector<KvMove>* moves);

  // Blocks the host and disk tiers hold above the default priority now,
  // per namespace that has any (with the forest's, the per-tenant bound's
  // measure). O(those blocks).
  std::vector<std::pair<std::string, int64_t>> RaisedPerNamespace() const;

  // The step that carried `moves` ran; `failed` are the indices of the ones
  // that failed. Unpins the loads' slots and forgets the failed moves'
  // blocks (a failed shared move: the belief that the store holds it).
  void Complete(absl::Span<const KvMove> moves, absl::Span<const int32_t> failed);

  const KvTierStats& stats() const { return stats_; }

  // The events since the last call, in order (record_events).
  std::vector<KvTierEvent> TakeEvents() { return std::exchange(events_, {}); }

  // Every slot in exactly one state (free, or holding the one block the map
  // says), the LRU lists and counters consistent. INTERNAL naming the
  // first inconsistency: for tests.
  absl::Status CheckInvariants() const;

 private:
  struct Tier {
    KvTier id = KvTier::kHost;
    int64_t capacity = 0;
    std::vector<uint64_t> key;          // per slot; meaningful when held
    std::vector<std::string> ns;        // per slot: the held block's namespace
    std::vector<bool> held;             // per slot
    std::vector<int32_t> pins;          // per slot: loads of the step in flight
    std::vector<int64_t> free;          // free slots, popped from the back
    std::unique_ptr<LruEviction> lru;   // held slots in eviction order, with their grants
  };

  Tier& TierOf(KvTier t) { return t == KvTier::kHost ? host_ : disk_; }
  const Tier& TierOf(KvTier t) const { return t == KvTier::kHost ? host_ : disk_; }
  void Touch(Tier& tier, int64_t slot);
  // A free slot of `tier` for a new block of retention `priority`, making
  // room as the header says; -1 when every held slot is pinned or of a
  // higher priority.
  int64_t Allocate(Tier& tier, int32_t priority, std::vector<KvMove>* moves);
  void Hold(Tier& tier, int64_t slot, uint64_t key, const RetentionGrants* grants, std::string ns);
  void Drop(int32_t priority);  // counts a block forgotten for room
  void Expire();
  void Forget(uint64_t key);  // frees its slot
  void RememberShared(uint64_t key);
  void ForgetShared(uint64_t key);
  void Note(KvTier tier, bool stored, uint64_t key) {
    if (record_events_) events_.push_back({tier, stored, key});
  }

  Tier host_, disk_;
  absl::flat_hash_map<uint64_t, Location> where_;
  bool shared_ = false;
  int64_t shared_known_max_ = 0;
  absl::flat_hash_set<uint64_t> shared_known_;
  std::deque<uint64_t> shared_order_;  // the oldest belief first, forgotten first (may name forgotten keys)
  KvTierStats stats_;
  bool record_events_ = false;
  std::vector<KvTierEvent> events_;
  const Clock* clock_;  // retention grants' ends
};

// "host", "disk" or "shared": the tier's name in metrics and GetCacheStats.
std::string_view KvTierName(KvTier tier);

// --kv_tier_write_policy: "write_through" (true: keep each block in the
// tiers once computed) or "write_back" (false: when the pool evicts it);
// INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<bool> ParseKvTierWritePolicy(std::string_view policy);

// The chained keys of a growing sequence's full blocks in namespace `ns`
// (block_hash.h's digests, published form), block 0 first, `chunk_size`
// tokens each; a partial last block has none yet. Extended as the sequence
// grows: one SHA-256 per new block.
class BlockKeyChain {
 public:
  BlockKeyChain(std::string_view ns, std::string_view seed);
  // Adds the keys of the full blocks of `tokens` not keyed yet. REQUIRES:
  // `tokens` extends the tokens of every earlier call.
  void Extend(absl::Span<const int32_t> tokens, int chunk_size);
  const std::vector<uint64_t>& keys() const { return keys_; }

 private:
  std::string ns_;
  BlockDigest digest_;
  std::vector<uint64_t> keys_;
};

// BlockKeyChain's keys of `tokens` at once.
std::vector<uint64_t> BlockKeys(absl::Span<const int32_t> tokens, int chunk_size, std::string_view ns,
                                std::string_view seed);

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_KV_TIERS_H_
