// The prefix-aware KV cache (PAKV): a forest of chunk nodes, one tree per cache
// namespace, in which sequences that share a prompt prefix share the physical
// KV chunks of that prefix. Found at runtime, with no configuration.
//
// Structure. A node holds up to `chunk_size` (c) tokens and exactly one
// physical chunk id (its NodeId *is* the chunk id). The node at depth k of a
// path holds the tokens at positions [k*c, k*c + num_tokens), so KV slots are
// always chunk-aligned: token p of a sequence lives in slot p % c of the
// sequence's chunk p / c. A node with children is full (c tokens); only leaves
// may be partial. Siblings may begin with the same tokens (two sequences that
// diverge inside a chunk each have their own chunk holding a copy of the
// common part).
//
// Sharing inside a chunk: copy-on-write, never node splitting. When a prompt
// matches only the first m tokens of a chunk (or goes on past a chunk that
// another live sequence is still filling), the new sequence gets a fresh chunk
// and the workers copy those m slots (a KvCopy); the m tokens count as
// matched. This keeps slots aligned, so the waste per sequence stays below one
// chunk. Two cases need no copy: a prompt that ends exactly where a partial
// chunk ends shares that chunk (copy-on-write happens at the first Append), and
// a cached, unreferenced leaf whose tokens are a prefix of the prompt is taken
// over and extended in place.
//
// Siblings are kept sorted by their tokens, so a lookup is a binary search per
// chunk; adding or removing a child costs O(siblings) (a vector insert), which
// at a prompt's divergence point is the number of requests that share it.
//
// Matching is the longest prefix over the whole tree: identical full siblings
// can exist (two sequences that filled copies of one chunk with the same
// tokens), so the walk explores every full chunk equal to the prompt's.
//
// Lifetime. A node's refcount is the number of live sequences whose path holds
// it. Remove() does not free chunks: a node whose refcount drops to 0 stays in
// the tree as *cached* so a later prompt can hit it, and is evicted LRU, only
// when an allocation finds the free list empty (or by EvictCached). Cached
// nodes are kept in release order, children before parents, so the least
// recently used cached node is always a leaf.
//
// Computed KV. Tokens enter the tree when they are scheduled, but their KV
// exists only once a worker step has written it; MarkComputed() records that.
// Only computed tokens are matched or copied, and Remove() drops the tokens of
// a sequence that leaves before its KV was computed (a cancelled prefill), so
// a cached chunk never claims KV that was not written.
//
// Every chunk is in exactly one state: free (in the allocator), used
// (refcount > 0) or cached (in the tree, refcount 0, every token computed):
//   used + cached + free == capacity.
//
// Not thread-safe: owned by the cache coordinator's loop thread.
#ifndef CHUNKATTN_SERVICES_CORE_PREFIX_FOREST_H_
#define CHUNKATTN_SERVICES_CORE_PREFIX_FOREST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "kernels/api/chunk_context.h"
#include "services/core/chunk_allocator.h"
#include "services/core/lru_eviction.h"
#include "services/core/retention.h"

namespace chunkattn {

using SeqId = int64_t;
using TokenId = int32_t;

// A block (a full chunk, every token computed) that LRU eviction is about to
// free: its chunk and the tokens and chunks of its whole path from the root
// of its namespace's tree, this block's last (its ancestors are all blocks,
// and stay in the tree past the callback). Valid during the callback only.
struct EvictedBlock {
  ChunkId chunk = 0;
  std::string_view ns;
  absl::Span<const TokenId> path;
  absl::Span<const ChunkId> chunks;  // path.size() / chunk_size of them; chunks.back() == chunk
  const RetentionGrants* grants = nullptr;  // its retention, which the tier keeps (never null)
};

// What Retain did.
struct RetainResult {
  int32_t chunks = 0;         // chunks the grant was given to
  int32_t capped_chunks = 0;  // chunks left out: raising them would pass the caller's bound
};

struct PrefixForestOptions {
  int chunk_size = kDefaultChunkSize;  // tokens per chunk, a power of two in [16, 256]
  int32_t num_chunks = 0;              // pool capacity (see ChunkAllocator::FromBudget)
  int32_t max_seq_len = 1 << 20;       // longest sequence accepted, tokens
  const Clock* clock = nullptr;        // borrowed; ages of cached chunks (null: the wall clock)
};

struct InsertResult {
  SeqId seq_id = 0;
  // Leading prompt tokens whose KV is in the pool once `copies` are applied:
  // the workers compute and write KV only for tokens [matched_tokens, length).
  // May equal the length (the whole prompt is cached): the worker then still
  // runs the last prompt token for the first output's logits, but does not
  // write its KV (its slot already holds it, possibly read by other sequences).
  int32_t matched_tokens = 0;
  std::vector<KvCopy> copies;  // at most one
};

// A change to the set of *blocks*: full chunks whose every token is computed
// (the KV-event stream's unit, services/kv_events). A chunk is reported
// stored once, when it becomes a block, and removed once, when it is freed;
// partial chunks never are. Stored blocks of one path come parent first, and
// a block is removed only after its children.
struct BlockEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  ChunkId chunk = 0;
  ChunkId parent = -1;          // kStored: the block before it; -1 at depth 0
  std::string ns;               // kStored at depth 0: its namespace
  std::vector<TokenId> tokens;  // kStored: its chunk_size tokens (copied: the chunk may be reused before the
                                // events are taken)
};

struct AppendResult {
  std::vector<KvCopy> copies;  // at most one (copy-on-write of a shared tail)
};

// Counters for metrics. Gauges describe the pool now; totals are cumulative.
struct CacheStats {
  int32_t capacity_chunks = 0;
  int32_t used_chunks = 0;    // referenced by a live sequence
  int32_t cached_chunks = 0;  // unreferenced, kept for reuse, evictable
  int32_t free_chunks = 0;
  int32_t shared_chunks = 0;  // referenced by two or more live sequences
  int64_t live_sequences = 0;
  int64_t logical_tokens = 0;   // sum of live sequence lengths
  int64_t physical_tokens = 0;  // tokens stored in used chunks
  int64_t cached_tokens = 0;    // tokens stored in cached chunks
  int64_t total_inserts = 0;
  int64_t total_prompt_tokens = 0;   // tokens asked for by Insert
  int64_t total_matched_tokens = 0;  // of those, found in the cache
  int64_t total_evictions = 0;       // chunks evicted
  double oldest_cached_seconds = 0;  // since the next chunk to evict was cached (0: none is)
  // Retention (retention.h): chunks (in use or cached) per priority band, as
  // of the last expiry; evictions by the band the chunk was in.
  int32_t band_chunks[kNumRetentionBands] = {};  // kDefault: filled in by stats()
  int64_t band_evictions_total[kNumRetentionBands] = {};
  int64_t total_copies = 0;          // KvCopy operations reported
  int64_t total_copied_tokens = 0;

  // The fraction of the pool that running sequences hold (a shared chunk
  // once; cached chunks are reusable, so not counted): vLLM's
  // kv_cache_usage_perc, what routers read as load. 0 for an empty pool.
  double kv_usage() const {
    return capacity_chunks > 0 ? static_cast<double>(used_chunks) / static_cast<double>(capacity_chunks) : 0.0;
  }
};

class PrefixForest {
 public:
  // INVALID_ARGUMENT for a chunk size that is not a power of two in [16, 256],
  // a pool of fewer than one chunk, or a non-positive max_seq_len.
  static absl::StatusOr<std::unique_ptr<PrefixForest>> Create(const PrefixForestOptions& options);

  PrefixForest(const PrefixForest&) = delete;
  PrefixForest& operator=(const PrefixForest&) = delete;
  ~PrefixForest();

  // A new sequence with `tokens` in namespace `ns` (tenant isolation: trees
  // of different namespaces never share chunks; "" is the shared namespace).
  // Longest-prefix match at token granularity, then fresh chunks for the rest;
  // all-or-nothing. INVALID_ARGUMENT: empty, negative token, longer than
  // max_seq_len. RESOURCE_EXHAUSTED: the free plus evictable chunks cannot
  // hold the unmatched part (the message says what was asked and what is free).
  absl::StatusOr<InsertResult> Insert(absl::Span<const TokenId> tokens, std::string_view ns = "");

  // Decode growth: `tokens` extend sequence `seq`. A new chunk when the tail is
  // full; copy-on-write when the tail is partial and another live sequence
  // holds it. All-or-nothing. NOT_FOUND: unknown sequence. INVALID_ARGUMENT:
  // empty or negative token, over max_seq_len. FAILED_PRECONDITION: some of
  // the sequence's tokens are not computed yet (a decode step follows the step
  // that computed them). RESOURCE_EXHAUSTED: no chunk.
  absl::StatusOr<AppendResult> Append(SeqId seq, absl::Span<const TokenId> tokens);

  // `n` new sequences that continue `seq` and share all of its chunks (parallel
  // sampling); `seq` itself stays live. Each copy-on-writes its partial tail on
  // its first Append. NOT_FOUND: unknown sequence. INVALID_ARGUMENT: n < 1 or
  // n > 4096.
  absl::StatusOr<std::vector<SeqId>> Fork(SeqId seq, int n);

  // The sequence leaves. Its chunks stay cached, less the tokens whose KV was
  // never computed (a chunk left with none is freed). NOT_FOUND: unknown.
  absl::Status Remove(SeqId seq);

  // A worker step has written the KV of positions [0, upto) of `seq`. O(chunks
  // newly completed). NOT_FOUND: unknown sequence. INVALID_ARGUMENT: upto
  // outside [0, length].
  absl::Status MarkComputed(SeqId seq, int32_t upto);
  absl::Status MarkComputed(SeqId seq);  // all of its tokens
  // Every token of every live sequence is computed (the step that was planned
  // has run). O(live sequences).
  void MarkAllComputed();

  // Evicts up to `max_chunks` cached chunks, the lowest retention priority
  // first, least recently used within a priority. Returns how many were evicted.
  int32_t EvictCached(int32_t max_chunks);

  // Retention (retention.h): the chunks holding the first `prefix_tokens`
  // tokens of `seq` (every chunk with one of them) get `grant`, root first.
  // A grant that would lift a chunk from the default priority to above it
  // counts against `max_raised`: the first chunk past that bound
  // and those after it are left as they are (a prefix keeps its priority
  // order). NOT_FOUND: unknown sequence. INVALID_ARGUMENT: prefix_tokens
  // outside [1, length], a priority off the scale, max_raised < 0.
  absl::StatusOr<RetainResult> Retain(SeqId seq, int32_t prefix_tokens, RetentionGrant grant, int32_t max_raised);
  // Gives the chunk holding block `block` of `seq` (tokens [block * chunk
  // size, ...)) `grants`, unbounded: a block a KV tier loads back brings
  // the grants it left the pool with (kv_tiers.h). The caller gives each
  // ancestor a superset, as Retain does. NOT_FOUND: unknown sequence;
  // INVALID_ARGUMENT: no such block.
  absl::Status MergeGrants(SeqId seq, int32_t block, const RetentionGrants& grants);
  // Applies the grants that ended by the clock's now (the other calls do
  // too, first): chunks fall back a band, the counts follow.
  void ExpireRetention();
  // A used or cached chunk's retention priority now (the default for a free one).
  int32_t ChunkPriority(ChunkId chunk) const;
  // Chunks above the default priority per namespace that holds any (the
  // per-tenant bound's measure). O(namespaces).
  std::vector<std::pair<std::string, int32_t>> RaisedPerNamespace() const;

  // The (C, i, j) context of all live sequences. Rebuilt only when the
  // structure changed (O(live nodes and their cached children)); a step that only appended tokens into
  // existing chunks updates it in O(batch) and keeps its version. A step that
  // only grew private chunks costs O(grown sequences). The reference stays
  // valid until the next mutating call.
  const ChunkContext& Context();
  // The index of `seq` in Context(); -1 for an unknown sequence.
  int32_t ContextIndex(SeqId seq);

  // Introspection (tests, the plan builder). NOT_FOUND for unknown sequences.
  absl::StatusOr<std::vector<TokenId>> Tokens(SeqId seq) const;
  absl::StatusOr<std::vector<ChunkId>> Chunks(SeqId seq) const;
  absl::StatusOr<int32_t> Length(SeqId seq) const;
  absl::StatusOr<int32_t> Computed(SeqId seq) const;  // tokens with KV
  // Flat KV slots (chunk * chunk_size + slot) of positions [begin, end) of `seq`,
  // appended to `slots`. INVALID_ARGUMENT unless 0 <= begin <= end <= length.
  absl::Status Slots(SeqId seq, int32_t begin, int32_t end, std::vector<int64_t>* slots) const;

  enum class ChunkState { kFree, kUsed, kCached };
  ChunkState State(ChunkId chunk) const;
  // Tokens stored in a used or cached chunk (empty for a free one).
  absl::Span<const TokenId> ChunkTokens(ChunkId chunk) const;
  // Of those, how many have computed KV.
  int32_t ChunkComputed(ChunkId chunk) const;
  int32_t RefCount(ChunkId chunk) const;

  // Block events (see BlockEvent), recorded from now on while on; off by
  // default, when recording costs nothing. TakeBlockEvents returns those
  // recorded since the last call, in order.
  void set_record_block_events(bool on) { record_block_events_ = on; }
  std::vector<BlockEvent> TakeBlockEvents() { return std::exchange(block_events_, {}); }

  // Called for each block LRU eviction frees, before its chunk can be
  // reused: a lower KV tier keeps it (services/core/kv_tiers.h). It must not
  // call back into the forest. Null: nothing is called (the default).
  void set_on_evict_block(std::function<void(const EvictedBlock&)> fn) { on_evict_block_ = std::move(fn); }
  // Whether `chunk` is a block now; its parent block (-1 at depth 0) and its
  // tree's namespace. For a chunk that is not used or cached: false, -1, "".
  bool IsBlock(ChunkId chunk) const;
  ChunkId ChunkParent(ChunkId chunk) const;
  std::string_view ChunkNamespace(ChunkId chunk) const;

  // Walks every internal structure (refcounts against sequence paths, the
  // cached list, sibling order, counters) and reports the first inconsistency
  // as INTERNAL. O(pool + sequences): for tests.
  absl::Status CheckInvariants() const;

  CacheStats stats() const;
  // Chunks (in use or cached) per namespace that holds any. O(namespaces):
  // each root keeps its count as chunks are linked and freed.
  std::vector<std::pair<std::string, int32_t>> ChunksPerNamespace() const;
  int chunk_size() const { return chunk_size_; }
  int32_t capacity() const { return allocator_.capacity(); }

 private:
  using NodeId = int32_t;  // < capacity: a chunk node (id == chunk id); >= capacity: a root
  static constexpr NodeId kNone = -1;
  struct Node;
  struct Sequence;

  explicit PrefixForest(const PrefixForestOptions& options);

  bool IsRoot(NodeId id) const { return id >= capacity(); }
  // A chunk's priority moved from `from` to `to`: its root's and the bands' counts.
  void NoteBand(NodeId id, int32_t from, int32_t to);
  // ExpireRetention at `now`, the caller's instant for the whole operation.
  void ExpireRetentionAt(absl::Time now);
  absl::Span<const TokenId> NodeTokens(NodeId id) const;
  bool TokensLess(NodeId a, NodeId b) const;
  // Among `parent`'s children, the one sharing the longest computed prefix
  // with `q`, and that length.
  std::pair<NodeId, int> BestChild(NodeId parent, absl::Span<const TokenId> q) const;
  // Index in `parent`'s children of the first child whose tokens are >= q.
  size_t LowerBound(NodeId parent, absl::Span<const TokenId> q) const;

  NodeId GetOrCreateRoot(std::string_view ns);
  void MaybeDeleteRoot(NodeId root);

  // Refcount transitions, with the counters and the cached list.
  void Acquire(NodeId id);
  void Release(NodeId id);

  // Sorted-children maintenance.
  void InsertChild(NodeId parent, NodeId child);
  void EraseChild(NodeId child);
  // Drops a released chunk's uncomputed tokens; frees it when none is left.
  void DropUncomputed(NodeId id);
  void WriteTokens(NodeId id, absl::Span<const TokenId> tokens);  // append, keep order

  // A chunk from the allocator, evicting the LRU cached leaf when none is free.
  // REQUIRES: free + cached > 0 (callers check capacity first).
  absl::StatusOr<NodeId> NewChild(NodeId parent, absl::Span<const TokenId> tokens);
  absl::Status EvictOne();
  // Unlinks a childless cached chunk and returns it to the allocator.
  absl::Status FreeCachedLeaf(NodeId id);
  // RESOURCE_EXHAUSTED unless free plus evictable chunks (less the cached ones
  // the caller is about to pin) cover `chunks_needed`; `what` names the request.
  absl::Status CheckCapacity(int64_t chunks_needed, int64_t pinned_cached,
                             const std::function<std::string()>& what) const;

  Sequence* FindSeq(SeqId id) const;
  void AddTail(NodeId node, Sequence* seq);
  void RemoveTail(NodeId node, Sequence* seq);

  void MarkComputedUpTo(Sequence* seq, int32_t upto);
  void RebuildContext();
  void PlacePrivateRange(Sequence* seq, int32_t extra);

  const int chunk_size_;
  const int32_t max_seq_len_;
  ChunkAllocator allocator_;
  std::vector<Node> nodes_;       // (capacity + roots)
  std::vector<TokenId> tokens_;   // (capacity * chunk_size): node id's tokens at id * c
  std::vector<NodeId> free_roots_;
  std::vector<std::string> root_names_;  // (roots) namespace of root capacity + r
  absl::flat_hash_map<std::string, NodeId> roots_;
  absl::flat_hash_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  SeqId next_seq_id_ = 1;

  LruEviction lru_;  // the cached chunks, in eviction order

  ChunkContext context_;
  bool structure_dirty_ = true;     // order or shared table must be rebuilt
  std::vector<Sequence*> grown_;    // sequences with new private chunks since Context()

  CacheStats stats_;
  const Clock* clock_;

  bool record_block_events_ = false;
  std::vector<BlockEvent> block_events_;
  std::function<void(const EvictedBlock&)> on_evict_block_;
  std::vector<TokenId> evicted_path_;  // on_evict_block's scratch
  std::vector<ChunkId> evicted_chunks_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_PREFIX_FOREST_H_
