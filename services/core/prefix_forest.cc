#include "services/core/prefix_forest.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace chunkattn {

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Spare entries left after each sequence's private range when the context is
// rebuilt, so the next chunk-full events of a decode extend it in place.
constexpr int32_t kPrivateSlack = 2;
constexpr int kMaxFork = 4096;

}  // namespace

struct PrefixForest::Node {
  NodeId parent = kNone;
  int32_t num_tokens = 0;  // roots: chunk_size (a root behaves as a full, computed chunk)
  int32_t num_computed = 0;  // leading tokens whose KV a worker has written
  int32_t refcount = 0;    // live sequences holding it; roots: live sequences in the tree
  int32_t pos_in_parent = -1;
  NodeId root = kNone;     // chunk nodes: the namespace's root
  int32_t chunks = 0;      // roots: chunk nodes below it
  int32_t raised = 0;      // roots: of those, above the default retention priority
  bool live = false;              // chunk nodes: in the tree; roots: namespace exists
  std::vector<NodeId> children;   // sorted by tokens (lexicographic); equal runs allowed
  std::vector<Sequence*> tails;   // live sequences whose last chunk this is
};

struct PrefixForest::Sequence {
  SeqId id = 0;
  NodeId root = kNone;
  std::vector<NodeId> path;  // chunk nodes in position order
  int32_t len = 0;           // tokens
  int32_t computed = 0;      // a lower bound on the leading tokens with KV
  int32_t ctx_index = -1;    // valid while the context is not structure-dirty
  int32_t ctx_cap_end = 0;   // end of the entries reserved for its private range
  int32_t tail_pos = -1;     // index in its last chunk's `tails`
};

absl::StatusOr<std::unique_ptr<PrefixForest>> PrefixForest::Create(const PrefixForestOptions& options) {
  if (!IsValidChunkSize(options.chunk_size)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk_size %d is not a power of two in [%d, %d]", options.chunk_size, kMinChunkSize, kMaxChunkSize));
  }
  if (options.num_chunks < 1 || options.num_chunks > kMaxChunks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_chunks %d outside [1, %d]", options.num_chunks, kMaxChunks));
  }
  if (options.max_seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("max_seq_len %d < 1", options.max_seq_len));
  }
  return std::unique_ptr<PrefixForest>(new PrefixForest(options));
}

PrefixForest::PrefixForest(const PrefixForestOptions& options)
    : chunk_size_(options.chunk_size),
      max_seq_len_(options.max_seq_len),
      allocator_(options.num_chunks),
      nodes_(options.num_chunks),
      tokens_(static_cast<size_t>(options.num_chunks) * options.chunk_size),
      lru_(options.num_chunks, options.clock),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()) {
  context_.chunk_size = chunk_size_;
}

PrefixForest::~PrefixForest() = default;

// ---------------------------------------------------------------------------
// Token order among siblings.

absl::Span<const TokenId> PrefixForest::NodeTokens(NodeId id) const {
  if (IsRoot(id)) return {};
  return absl::Span<const TokenId>(tokens_.data() + static_cast<size_t>(id) * chunk_size_,
                                   nodes_[id].num_tokens);
}

bool PrefixForest::TokensLess(NodeId a, NodeId b) const {
  const auto ta = NodeTokens(a), tb = NodeTokens(b);
  return std::lexicographical_compare(ta.begin(), ta.end(), tb.begin(), tb.end());
}

namespace {

// CheckInvariants' failures. A function, not a generic lambda, so that the
// format string is checked at compile time (Clang insists).
template <typename... Args>
absl::Status InvariantError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  return absl::InternalError(absl::StrFormat(format, args...));
}
int CommonPrefix(absl::Span<const TokenId> a, absl::Span<const TokenId> b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<int>(std::mismatch(a.begin(), a.begin() + n, b.begin()).first - a.begin());
}
}  // namespace

size_t PrefixForest::LowerBound(NodeId parent, absl::Span<const TokenId> q) const {
  const std::vector<NodeId>& ch = nodes_[parent].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), q, [&](NodeId a, absl::Span<const TokenId> key) {
    const auto t = NodeTokens(a);
    return std::lexicographical_compare(t.begin(), t.end(), key.begin(), key.end());
  });
  return static_cast<size_t>(it - ch.begin());
}

std::pair<PrefixForest::NodeId, int> PrefixForest::BestChild(NodeId parent,
                                                             absl::Span<const TokenId> q) const {
  // In lexicographic order, the child sharing the longest prefix with q is
  // next to q's insertion point. Only computed tokens count, though, so a
  // neighbour whose match runs into uncomputed tokens may lose to one further
  // out: walk outward while the plain prefix (which only shrinks away from q)
  // could still beat the best.
  const std::vector<NodeId>& ch = nodes_[parent].children;
  const size_t at = LowerBound(parent, q);
  NodeId best = kNone;
  int best_len = 0;
  auto consider = [&](NodeId n) {
    const int plain = CommonPrefix(NodeTokens(n), q);
    const int l = std::min(plain, nodes_[n].num_computed);
    if (l > best_len) best = n, best_len = l;
    return plain > best_len;
  };
  for (size_t k = at; k < ch.size() && consider(ch[k]); ++k) {
  }
  for (size_t k = at; k > 0 && consider(ch[k - 1]); --k) {
  }
  return {best, best_len};
}

void PrefixForest::InsertChild(NodeId parent, NodeId child) {
  std::vector<NodeId>& ch = nodes_[parent].children;
  auto it = std::upper_bound(ch.begin(), ch.end(), child,
                             [&](NodeId a, NodeId b) { return TokensLess(a, b); });
  const int32_t idx = static_cast<int32_t>(it - ch.begin());
  ch.insert(it, child);
  for (int32_t j = idx; j < static_cast<int32_t>(ch.size()); ++j) nodes_[ch[j]].pos_in_parent = j;
  nodes_[child].parent = parent;
}

void PrefixForest::EraseChild(NodeId child) {
  Node& n = nodes_[child];
  std::vector<NodeId>& ch = nodes_[n.parent].children;
  ch.erase(ch.begin() + n.pos_in_parent);
  for (int32_t j = n.pos_in_parent; j < static_cast<int32_t>(ch.size()); ++j) nodes_[ch[j]].pos_in_parent = j;
  n.parent = kNone;
  n.pos_in_parent = -1;
}

void PrefixForest::WriteTokens(NodeId id, absl::Span<const TokenId> tokens) {
  Node& n = nodes_[id];
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<size_t>(id) * chunk_size_ + n.num_tokens);
  n.num_tokens += static_cast<int32_t>(tokens.size());
  (n.refcount > 0 ? stats_.physical_tokens : stats_.cached_tokens) += static_cast<int64_t>(tokens.size());
  // Growing only moves a node later among its siblings.
  std::vector<NodeId>& ch = nodes_[n.parent].children;
  int32_t p = n.pos_in_parent;
  while (p + 1 < static_cast<int32_t>(ch.size()) && TokensLess(ch[p + 1], id)) {
    std::swap(ch[p], ch[p + 1]);
    nodes_[ch[p]].pos_in_parent = p;
    nodes_[ch[p + 1]].pos_in_parent = p + 1;
    ++p;
  }
}

// ---------------------------------------------------------------------------
// Refcounts, the cached (LRU) list, allocation and eviction.

void PrefixForest::Acquire(NodeId id) {
  Node& n = nodes_[id];
  if (n.refcount == 0) {
    lru_.Uncached(id);
    --stats_.cached_chunks;
    stats_.cached_tokens -= n.num_tokens;
    ++stats_.used_chunks;
    stats_.physical_tokens += n.num_tokens;
  } else if (n.refcount == 1) {
    ++stats_.shared_chunks;
  }
  ++n.refcount;
}

void PrefixForest::Release(NodeId id) {
  Node& n = nodes_[id];
  --n.refcount;
  if (n.refcount == 1) {
    --stats_.shared_chunks;
  } else if (n.refcount == 0) {
    --stats_.used_chunks;
    stats_.physical_tokens -= n.num_tokens;
    ++stats_.cached_chunks;
    stats_.cached_tokens += n.num_tokens;
    lru_.Cached(id);
  }
}

absl::Status PrefixForest::CheckCapacity(int64_t chunks_needed, int64_t pinned_cached,
                                         const std::function<std::string()>& what) const {
  const int64_t evictable = int64_t{stats_.cached_chunks} - pinned_cached;
  if (chunks_needed <= allocator_.num_free() + evictable) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "KV cache full: %s needs %d new chunks of %d tokens, but only %d are free and %d cached (evictable) of %d",
      what(), chunks_needed, chunk_size_, allocator_.num_free(), evictable, capacity()));
}

absl::Status PrefixForest::FreeCachedLeaf(NodeId id) {
  Node& n = nodes_[id];
  if (record_block_events_ && n.num_computed == chunk_size_) {
    BlockEvent e;
    e.kind = BlockEvent::Kind::kRemoved;
    e.chunk = id;
    block_events_.push_back(std::move(e));
  }
  lru_.Uncached(id);
  NoteBand(id, lru_.Priority(id), kDefaultRetentionPriority);
  lru_.ClearGrants(id);
  --stats_.cached_chunks;
  stats_.cached_tokens -= n.num_tokens;
  --nodes_[n.root].chunks;
  EraseChild(id);
  n = Node{};
  return allocator_.Free(id);
}

absl::Status PrefixForest::EvictOne() {
  const NodeId id = static_cast<NodeId>(lru_.Victim());
  if (id == LruEviction::kNone) return absl::InternalError("eviction with no cached chunk");
  if (!nodes_[id].children.empty()) {
    return absl::InternalError(absl::StrFormat("least recently used cached chunk %d has children", id));
  }
  const NodeId parent = nodes_[id].parent;
  if (on_evict_block_ && nodes_[id].num_computed == chunk_size_) {
    // The path root first: every ancestor of a cached leaf is in the tree.
    evicted_chunks_.clear();
    for (NodeId n = id; !IsRoot(n); n = nodes_[n].parent) evicted_chunks_.push_back(n);
    std::reverse(evicted_chunks_.begin(), evicted_chunks_.end());
    evicted_path_.clear();
    for (NodeId n : evicted_chunks_) {
      const absl::Span<const TokenId> t = NodeTokens(n);
      evicted_path_.insert(evicted_path_.end(), t.begin(), t.end());
    }
    const NodeId root = nodes_[id].root;
    on_evict_block_({id, root_names_[root - capacity()], evicted_path_, evicted_chunks_, &lru_.grants(id)});
  }
  const RetentionBand band = BandOf(lru_.Priority(id));
  RETURN_IF_ERROR(FreeCachedLeaf(id));
  ++stats_.total_evictions;
  ++stats_.band_evictions_total[static_cast<int>(band)];
  if (IsRoot(parent)) MaybeDeleteRoot(parent);
  return absl::OkStatus();
}

void PrefixForest::NoteBand(NodeId id, int32_t from, int32_t to) {
  const RetentionBand a = BandOf(from), b = BandOf(to);
  if (a == b) return;
  const int delta = b == RetentionBand::kHigh ? 1 : -1;
  stats_.band_chunks[static_cast<int>(RetentionBand::kHigh)] += delta;
  nodes_[nodes_[id].root].raised += delta;
}

void PrefixForest::ExpireRetention() { ExpireRetentionAt(clock_->Now()); }

void PrefixForest::ExpireRetentionAt(absl::Time now) {
  lru_.Expire(now, [this](int64_t id, int32_t from, int32_t to) { NoteBand(static_cast<NodeId>(id), from, to); });
}

absl::StatusOr<RetainResult> PrefixForest::Retain(SeqId id, int32_t prefix_tokens, RetentionGrant grant,
                                                  int32_t max_raised) {
  const Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  if (prefix_tokens < 1 || prefix_tokens > s->len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("retained prefix of %d tokens outside [1, %d]", prefix_tokens, s->len));
  }
  if (grant.priority < kMinRetentionPriority || grant.priority > kMaxRetentionPriority) {
    return absl::InvalidArgumentError(absl::StrFormat("retention priority %d outside [%d, %d]", grant.priority,
                                                      kMinRetentionPriority, kMaxRetentionPriority));
  }
  if (max_raised < 0) return absl::InvalidArgumentError(absl::StrFormat("max_raised %d < 0", max_raised));
  const absl::Time now = clock_->Now();
  ExpireRetentionAt(now);
  RetainResult result;
  const int32_t chunks = static_cast<int32_t>(CeilDiv(prefix_tokens, chunk_size_));
  const bool raises = grant.priority > kDefaultRetentionPriority;
  for (int32_t k = 0; k < chunks; ++k) {
    const NodeId n = s->path[k];
    if (raises && lru_.Priority(n) <= kDefaultRetentionPriority) {
      if (max_raised == 0) {
        // Grants below are subsets of their parent's: stop here.
        result.capped_chunks = chunks - k;
        break;
      }
      --max_raised;
    }
    const int32_t before = lru_.Grant(n, grant, now);
    NoteBand(n, before, lru_.Priority(n));
    ++result.chunks;
  }
  return result;
}

absl::Status PrefixForest::MergeGrants(SeqId id, int32_t block, const RetentionGrants& grants) {
  const Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  if (block < 0 || block >= static_cast<int32_t>(s->path.size())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("block %d outside [0, %d) of sequence %d", block, s->path.size(), id));
  }
  if (grants.empty()) return absl::OkStatus();
  const absl::Time now = clock_->Now();
  ExpireRetentionAt(now);
  const NodeId n = s->path[block];
  const int32_t before = lru_.Merge(n, grants, now);
  NoteBand(n, before, lru_.Priority(n));
  return absl::OkStatus();
}

int32_t PrefixForest::ChunkPriority(ChunkId chunk) const {
  return allocator_.IsAllocated(chunk) ? lru_.Priority(chunk) : kDefaultRetentionPriority;
}

std::vector<std::pair<std::string, int32_t>> PrefixForest::RaisedPerNamespace() const {
  std::vector<std::pair<std::string, int32_t>> out;
  for (const auto& [ns, root] : roots_) {
    if (nodes_[root].raised > 0) out.emplace_back(ns, nodes_[root].raised);
  }
  return out;
}

int32_t PrefixForest::EvictCached(int32_t max_chunks) {
  ExpireRetention();
  int32_t evicted = 0;
  while (evicted < max_chunks && lru_.size() > 0 && EvictOne().ok()) ++evicted;
  return evicted;
}

absl::StatusOr<PrefixForest::NodeId> PrefixForest::NewChild(NodeId parent, absl::Span<const TokenId> tokens) {
  if (allocator_.num_free() == 0) RETURN_IF_ERROR(EvictOne());
  ASSIGN_OR_RETURN(const ChunkId id, allocator_.Allocate());
  Node& n = nodes_[id];
  n = Node{};
  n.live = true;
  n.refcount = 1;
  n.root = IsRoot(parent) ? parent : nodes_[parent].root;
  ++nodes_[n.root].chunks;
  n.num_tokens = static_cast<int32_t>(tokens.size());
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(id) * chunk_size_);
  ++stats_.used_chunks;
  stats_.physical_tokens += n.num_tokens;
  InsertChild(parent, id);
  return id;
}

// ---------------------------------------------------------------------------
// Namespaces and sequences.

PrefixForest::NodeId PrefixForest::GetOrCreateRoot(std::string_view ns) {
  if (auto it = roots_.find(absl::string_view(ns.data(), ns.size())); it != roots_.end()) return it->second;
  NodeId id;
  if (!free_roots_.empty()) {
    id = free_roots_.back();
    free_roots_.pop_back();
  } else {
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
    root_names_.emplace_back();
  }
  nodes_[id] = Node{};
  nodes_[id].live = true;
  nodes_[id].num_tokens = chunk_size_;
  nodes_[id].num_computed = chunk_size_;
  root_names_[id - capacity()] = std::string(ns);
  roots_.emplace(std::string(ns), id);
  return id;
}

void PrefixForest::MaybeDeleteRoot(NodeId root) {
  Node& r = nodes_[root];
  if (r.refcount > 0 || !r.children.empty()) return;
  roots_.erase(root_names_[root - capacity()]);
  root_names_[root - capacity()].clear();
  r = Node{};
  free_roots_.push_back(root);
}

PrefixForest::Sequence* PrefixForest::FindSeq(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void PrefixForest::AddTail(NodeId node, Sequence* seq) {
  std::vector<Sequence*>& t = nodes_[node].tails;
  seq->tail_pos = static_cast<int32_t>(t.size());
  t.push_back(seq);
}

void PrefixForest::RemoveTail(NodeId node, Sequence* seq) {
  // O(1) even when thousands of forks end in one chunk.
  std::vector<Sequence*>& t = nodes_[node].tails;
  t[seq->tail_pos] = t.back();
  t[seq->tail_pos]->tail_pos = seq->tail_pos;
  t.pop_back();
  seq->tail_pos = -1;
}

namespace {
absl::Status ValidateTokens(absl::Span<const TokenId> tokens, int64_t existing, int32_t max_len) {
  if (tokens.empty()) return absl::InvalidArgumentError("tokens is empty");
  if (existing + static_cast<int64_t>(tokens.size()) > max_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence of %d tokens exceeds max_seq_len %d", existing + static_cast<int64_t>(tokens.size()), max_len));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("tokens[%d] = %d is negative", i, tokens[i]));
    }
  }
  return absl::OkStatus();
}
}  // namespace

// ---------------------------------------------------------------------------
// Operations.

absl::StatusOr<InsertResult> PrefixForest::Insert(absl::Span<const TokenId> tokens, std::string_view ns) {
  RETURN_IF_ERROR(ValidateTokens(tokens, 0, max_seq_len_));
  ExpireRetention();  // evictions below take the victims of now
  const int c = chunk_size_;
  const int32_t len = static_cast<int32_t>(tokens.size());
  auto chunk_at = [&](int32_t pos) { return tokens.subspan(pos, std::min(c, len - pos)); };

  // 1. The longest match: the deepest chain of full chunks equal to the
  // prompt's, then the longest partial match below it. A DFS, because equal
  // full siblings may exist; each node is visited at most once.
  auto root_it = roots_.find(absl::string_view(ns.data(), ns.size()));
  NodeId frontier = root_it == roots_.end() ? kNone : root_it->second;  // end of the full chain
  int32_t pos = 0;    // tokens matched by the full chain
  NodeId best = kNone;  // child of `frontier` sharing the most tokens with the rest
  int lcp = 0;
  if (frontier != kNone) {
    std::vector<std::pair<NodeId, int32_t>> stack = {{frontier, 0}};
    int64_t best_score = -1;
    while (!stack.empty()) {
      const auto [node, at] = stack.back();
      stack.pop_back();
      auto [child, common] = at < len ? BestChild(node, chunk_at(at)) : std::make_pair(kNone, 0);
      if (common == c) {
        const auto q = chunk_at(at);
        const std::vector<NodeId>& ch = nodes_[node].children;
        for (size_t k = LowerBound(node, q); k < ch.size() && NodeTokens(ch[k]) == q; ++k) {
          if (nodes_[ch[k]].num_computed == c) stack.emplace_back(ch[k], at + c);
        }
        continue;
      }
      // Longest first; on a tie prefer a chain that live sequences hold, so
      // they share it (one chunk-first pass) and its duplicate ages out.
      const int64_t score = 2 * (int64_t{at} + common) + (nodes_[node].refcount > 0 ? 1 : 0);
      if (score > best_score) {
        best_score = score;
        frontier = node;
        pos = at;
        best = child;
        lcp = common;
      }
    }
  }
  std::vector<NodeId> path;
  for (NodeId n = frontier; n != kNone && !IsRoot(n); n = nodes_[n].parent) path.push_back(n);
  std::reverse(path.begin(), path.end());

  // 2. Below the chain: share a partial chunk equal to the rest of the prompt,
  // take over a cached leaf that the prompt extends, or copy what matched.
  NodeId share = kNone, takeover = kNone, copy_src = kNone;
  if (lcp > 0) {
    const auto q = chunk_at(pos);
    const auto head = q.first(lcp);
    const std::vector<NodeId>& ch = nodes_[frontier].children;
    for (size_t k = LowerBound(frontier, head); k < ch.size() && NodeTokens(ch[k]) == head; ++k) {
      const Node& n = nodes_[ch[k]];
      if (lcp == static_cast<int>(q.size())) {
        if (n.num_computed < n.num_tokens) continue;
        if (share == kNone || n.refcount > 0) share = ch[k];
        if (n.refcount > 0) break;
      } else if (n.refcount == 0 && n.children.empty()) {
        takeover = ch[k];
        break;
      }
    }
    if (share == kNone && takeover == kNone) copy_src = best;
  }
  const NodeId reused = share != kNone ? share : takeover;

  // 3. Room for the rest, counting the cached chunks this insert is about to
  // pin as not evictable.
  const int64_t chunks_needed = CeilDiv(len - pos, c) - (reused != kNone ? 1 : 0);
  int64_t pinned_cached = 0;
  for (NodeId n : path) pinned_cached += nodes_[n].refcount == 0;
  for (NodeId n : {reused, copy_src}) pinned_cached += n != kNone && nodes_[n].refcount == 0;
  RETURN_IF_ERROR(CheckCapacity(chunks_needed, pinned_cached, [&] {
    return absl::StrFormat("a prompt of %d tokens (%d cached)", len, pos + lcp);
  }));

  // 4. Commit. Nothing below fails once the capacity check passed. The root's
  // refcount is raised first so that eviction cannot delete it meanwhile.
  const NodeId root = GetOrCreateRoot(ns);
  NodeId cur = path.empty() ? root : path.back();
  ++nodes_[root].refcount;
  for (NodeId n : path) Acquire(n);
  if (copy_src != kNone) Acquire(copy_src);  // pinned: the allocations below must not evict it

  InsertResult result;
  if (pos < len) {
    const auto q = chunk_at(pos);
    if (reused != kNone) {
      Acquire(reused);
      const int32_t have = nodes_[reused].num_tokens;
      if (static_cast<int32_t>(q.size()) > have) WriteTokens(reused, q.subspan(have));
      cur = reused;
    } else {
      ASSIGN_OR_RETURN(cur, NewChild(cur, q));
      if (copy_src != kNone) result.copies.push_back(KvCopy{copy_src, cur, lcp});
    }
    path.push_back(cur);
    for (int32_t p = pos + c; p < len; p += c) {
      ASSIGN_OR_RETURN(cur, NewChild(cur, chunk_at(p)));
      path.push_back(cur);
    }
  }
  if (copy_src != kNone) Release(copy_src);

  auto seq = std::make_unique<Sequence>();
  seq->id = next_seq_id_++;
  seq->root = root;
  seq->path = std::move(path);
  seq->len = len;
  seq->computed = pos;  // copied and newly written slots count once the step runs
  AddTail(cur, seq.get());
  result.seq_id = seq->id;
  result.matched_tokens = pos + lcp;
  seqs_.emplace(seq->id, std::move(seq));

  stats_.logical_tokens += len;
  ++stats_.total_inserts;
  stats_.total_prompt_tokens += len;
  stats_.total_matched_tokens += result.matched_tokens;
  if (copy_src != kNone) {
    ++stats_.total_copies;
    stats_.total_copied_tokens += lcp;
  }
  structure_dirty_ = true;
  return result;
}

absl::StatusOr<AppendResult> PrefixForest::Append(SeqId id, absl::Span<const TokenId> tokens) {
  Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  RETURN_IF_ERROR(ValidateTokens(tokens, s->len, max_seq_len_));
  ExpireRetention();
  if (s->computed < s->len) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence %d: append before its KV was computed (%d of %d tokens; call MarkComputed)", id, s->computed,
        s->len));
  }
  const int c = chunk_size_;
  const int32_t n = static_cast<int32_t>(tokens.size());
  const NodeId tail = s->path.back();
  const int32_t have = nodes_[tail].num_tokens;
  const int32_t room = c - have;
  // A partial tail that another live sequence holds is copied, never written.
  const bool cow = nodes_[tail].refcount > 1 && room > 0;
  RETURN_IF_ERROR(CheckCapacity((cow ? 1 : 0) + CeilDiv(std::max(0, n - room), c), 0,
                                [&] { return absl::StrFormat("appending %d tokens", n); }));

  AppendResult result;
  const size_t old_chunks = s->path.size();
  int32_t i = std::min(n, room);
  if (cow) {
    std::vector<TokenId> merged(NodeTokens(tail).begin(), NodeTokens(tail).end());
    merged.insert(merged.end(), tokens.begin(), tokens.begin() + i);
    ASSIGN_OR_RETURN(const NodeId copy, NewChild(nodes_[tail].parent, merged));
    result.copies.push_back(KvCopy{tail, copy, have});
    ++stats_.total_copies;
    stats_.total_copied_tokens += have;
    RemoveTail(tail, s);
    Release(tail);
    s->path.back() = copy;
    AddTail(copy, s);
  } else if (i > 0) {
    WriteTokens(tail, tokens.first(i));
  }
  while (i < n) {
    const int32_t k = std::min(c, n - i);
    ASSIGN_OR_RETURN(const NodeId next, NewChild(s->path.back(), tokens.subspan(i, k)));
    RemoveTail(s->path.back(), s);
    s->path.push_back(next);
    AddTail(next, s);
    i += k;
  }
  s->len += n;
  stats_.logical_tokens += n;

  // Keep the context current without a rebuild unless the shared structure
  // changed (copy-on-write moves the sequence off a shared chunk).
  if (cow) {
    structure_dirty_ = true;
  } else if (!structure_dirty_) {
    ChunkContext& ctx = context_;
    const int32_t idx = s->ctx_index;
    ctx.seq_len[idx] = s->len;
    const size_t grown = s->path.size() - old_chunks;
    int32_t& end = ctx.private_end[idx];
    if (grown > 0) {
      // The old tail is full now; if it was private it is the last entry.
      if (end > ctx.private_begin[idx]) ctx.private_tokens[end - 1] = c;
      if (end + static_cast<int32_t>(grown) > s->ctx_cap_end) PlacePrivateRange(s, static_cast<int32_t>(grown));
      for (size_t k = old_chunks; k < s->path.size(); ++k) {
        ctx.private_chunk[end] = s->path[k];
        ctx.private_tokens[end] = nodes_[s->path[k]].num_tokens;
        ++end;
      }
      ++ctx.version;
    } else {
      ctx.private_tokens[end - 1] = nodes_[s->path.back()].num_tokens;
    }
  }
  return result;
}

void PrefixForest::PlacePrivateRange(Sequence* s, int32_t extra) {
  // Moves the sequence's private range to the end of the table with room for
  // `extra` more entries and then as many again; the old entries become unused.
  ChunkContext& ctx = context_;
  const int32_t idx = s->ctx_index;
  const int32_t begin = ctx.private_begin[idx], end = ctx.private_end[idx];
  const int32_t count = end - begin;
  const int32_t new_begin = static_cast<int32_t>(ctx.private_chunk.size());
  const int32_t reserve = 2 * (count + extra) + kPrivateSlack;
  ctx.private_chunk.resize(new_begin + reserve, -1);
  ctx.private_tokens.resize(new_begin + reserve, 0);
  for (int32_t k = 0; k < count; ++k) {
    ctx.private_chunk[new_begin + k] = ctx.private_chunk[begin + k];
    ctx.private_tokens[new_begin + k] = ctx.private_tokens[begin + k];
    ctx.private_chunk[begin + k] = -1;
    ctx.private_tokens[begin + k] = 0;
  }
  ctx.private_begin[idx] = new_begin;
  ctx.private_end[idx] = new_begin + count;
  s->ctx_cap_end = new_begin + reserve;
}

absl::StatusOr<std::vector<SeqId>> PrefixForest::Fork(SeqId id, int n) {
  Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  if (n < 1 || n > kMaxFork) {
    return absl::InvalidArgumentError(absl::StrFormat("fork count %d outside [1, %d]", n, kMaxFork));
  }
  std::vector<SeqId> ids;
  ids.reserve(n);
  for (int k = 0; k < n; ++k) {
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_id_++;
    child->root = s->root;
    child->path = s->path;
    child->len = s->len;
    child->computed = s->computed;
    for (NodeId node : child->path) Acquire(node);
    ++nodes_[s->root].refcount;
    AddTail(child->path.back(), child.get());
    stats_.logical_tokens += child->len;
    ids.push_back(child->id);
    seqs_.emplace(child->id, std::move(child));
  }
  structure_dirty_ = true;
  return ids;
}

absl::Status PrefixForest::Remove(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  Sequence* s = it->second.get();
  RemoveTail(s->path.back(), s);
  // Leaf first, so a cached child is always older in the LRU list than its
  // cached parent and eviction always finds a leaf at the head.
  for (auto p = s->path.rbegin(); p != s->path.rend(); ++p) {
    Release(*p);
    if (nodes_[*p].refcount == 0 && nodes_[*p].num_computed < nodes_[*p].num_tokens) DropUncomputed(*p);
  }
  const NodeId root = s->root;
  --nodes_[root].refcount;
  stats_.logical_tokens -= s->len;
  seqs_.erase(it);
  MaybeDeleteRoot(root);
  structure_dirty_ = true;
  return absl::OkStatus();
}

void PrefixForest::DropUncomputed(NodeId id) {
  Node& n = nodes_[id];
  // Uncomputed tokens only ever follow computed ones along a path, so the
  // children of a chunk with uncomputed tokens were uncomputed too and were
  // dropped before it (Remove releases leaf first).
  if (!n.children.empty()) return;
  if (n.num_computed == 0) {
    (void)FreeCachedLeaf(id);  // cannot fail: the chunk was in the tree
    return;
  }
  stats_.cached_tokens -= n.num_tokens - n.num_computed;
  // A shorter token list may sort earlier among the siblings.
  const NodeId parent = n.parent;
  EraseChild(id);
  n.num_tokens = n.num_computed;
  InsertChild(parent, id);
}

void PrefixForest::MarkComputedUpTo(Sequence* s, int32_t upto) {
  const int c = chunk_size_;
  for (int32_t k = s->computed / c; k * c < upto; ++k) {
    const NodeId id = s->path[k];
    Node& n = nodes_[id];
    const int32_t before = n.num_computed;
    n.num_computed = std::max(n.num_computed, std::min(c, upto - k * c));
    if (record_block_events_ && before < c && n.num_computed == c) {
      BlockEvent e;
      e.chunk = id;
      e.parent = IsRoot(n.parent) ? -1 : n.parent;
      if (IsRoot(n.parent)) e.ns = root_names_[n.parent - capacity()];
      const absl::Span<const TokenId> t = NodeTokens(id);
      e.tokens.assign(t.begin(), t.end());
      block_events_.push_back(std::move(e));
    }
  }
  s->computed = std::max(s->computed, upto);
}

absl::Status PrefixForest::MarkComputed(SeqId id, int32_t upto) {
  Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  if (upto < 0 || upto > s->len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("computed length %d outside [0, %d] of sequence %d", upto, s->len, id));
  }
  MarkComputedUpTo(s, upto);
  return absl::OkStatus();
}

absl::Status PrefixForest::MarkComputed(SeqId id) {
  Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  MarkComputedUpTo(s, s->len);
  return absl::OkStatus();
}

void PrefixForest::MarkAllComputed() {
  for (const auto& [id, s] : seqs_) MarkComputedUpTo(s.get(), s->len);
}

// ---------------------------------------------------------------------------
// The (C, i, j) context.

const ChunkContext& PrefixForest::Context() {
  if (structure_dirty_) RebuildContext();
  return context_;
}

int32_t PrefixForest::ContextIndex(SeqId id) {
  const Sequence* s = FindSeq(id);
  if (s == nullptr) return -1;
  Context();
  return s->ctx_index;
}

void PrefixForest::RebuildContext() {
  ChunkContext& ctx = context_;
  ctx.chunk_size = chunk_size_;
  ++ctx.version;
  ctx.seq_ids.clear();
  ctx.seq_len.clear();
  ctx.shared_chunk.clear();
  ctx.shared_begin.clear();
  ctx.shared_end.clear();
  ctx.shared_tokens.clear();
  ctx.private_begin.clear();
  ctx.private_end.clear();
  ctx.private_chunk.clear();
  ctx.private_tokens.clear();

  // Pre-order DFS over live nodes: the sequences ending in a node's subtree
  // get consecutive indices, so a node's range is [next, next + refcount).
  std::vector<Sequence*> order;
  order.reserve(seqs_.size());
  std::vector<NodeId> stack;
  for (NodeId r = capacity(); r < static_cast<NodeId>(nodes_.size()); ++r) {
    if (!nodes_[r].live || nodes_[r].refcount == 0) continue;
    stack.push_back(r);
    while (!stack.empty()) {
      const NodeId id = stack.back();
      stack.pop_back();
      const Node& n = nodes_[id];
      if (!IsRoot(id) && n.refcount >= 2) {
        const int32_t i = static_cast<int32_t>(order.size());
        ctx.shared_chunk.push_back(id);
        ctx.shared_begin.push_back(i);
        ctx.shared_end.push_back(i + n.refcount);
        ctx.shared_tokens.push_back(n.num_tokens);
      }
      for (Sequence* s : n.tails) order.push_back(s);
      for (auto c = n.children.rbegin(); c != n.children.rend(); ++c) {
        if (nodes_[*c].refcount > 0) stack.push_back(*c);
      }
    }
  }
  const int32_t num_seqs = static_cast<int32_t>(order.size());
  ctx.seq_ids.reserve(num_seqs);
  ctx.seq_len.reserve(num_seqs);
  ctx.private_begin.reserve(num_seqs);
  ctx.private_end.reserve(num_seqs);
  for (int32_t i = 0; i < num_seqs; ++i) {
    Sequence* s = order[i];
    s->ctx_index = i;
    ctx.seq_ids.push_back(s->id);
    ctx.seq_len.push_back(s->len);
    // Refcounts never increase along a path, so the private chunks (refcount
    // 1) are a suffix of it.
    size_t first = s->path.size();
    while (first > 0 && nodes_[s->path[first - 1]].refcount == 1) --first;
    const int32_t begin = static_cast<int32_t>(ctx.private_chunk.size());
    for (size_t k = first; k < s->path.size(); ++k) {
      ctx.private_chunk.push_back(s->path[k]);
      ctx.private_tokens.push_back(nodes_[s->path[k]].num_tokens);
    }
    ctx.private_begin.push_back(begin);
    ctx.private_end.push_back(static_cast<int32_t>(ctx.private_chunk.size()));
    ctx.private_chunk.insert(ctx.private_chunk.end(), kPrivateSlack, -1);
    ctx.private_tokens.insert(ctx.private_tokens.end(), kPrivateSlack, 0);
    s->ctx_cap_end = static_cast<int32_t>(ctx.private_chunk.size());
  }
  structure_dirty_ = false;
}

// ---------------------------------------------------------------------------
// Introspection.

absl::StatusOr<std::vector<TokenId>> PrefixForest::Tokens(SeqId id) const {
  const Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  std::vector<TokenId> out;
  out.reserve(s->len);
  for (size_t k = 0; k < s->path.size(); ++k) {
    const auto t = NodeTokens(s->path[k]);
    const size_t take = std::min<size_t>(t.size(), s->len - k * chunk_size_);
    out.insert(out.end(), t.begin(), t.begin() + take);
  }
  return out;
}

absl::StatusOr<std::vector<ChunkId>> PrefixForest::Chunks(SeqId id) const {
  const Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  return s->path;
}

absl::StatusOr<int32_t> PrefixForest::Computed(SeqId id) const {
  const Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  return s->computed;
}

absl::StatusOr<int32_t> PrefixForest::Length(SeqId id) const {
  const Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  return s->len;
}

absl::Status PrefixForest::Slots(SeqId id, int32_t begin, int32_t end, std::vector<int64_t>* slots) const {
  const Sequence* s = FindSeq(id);
  if (s == nullptr) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", id));
  if (begin < 0 || end < begin || end > s->len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("positions [%d, %d) outside sequence of %d tokens", begin, end, s->len));
  }
  for (int32_t p = begin; p < end; ++p) {
    slots->push_back(int64_t{s->path[p / chunk_size_]} * chunk_size_ + p % chunk_size_);
  }
  return absl::OkStatus();
}

PrefixForest::ChunkState PrefixForest::State(ChunkId chunk) const {
  if (!allocator_.IsAllocated(chunk)) return ChunkState::kFree;
  return nodes_[chunk].refcount > 0 ? ChunkState::kUsed : ChunkState::kCached;
}

absl::Span<const TokenId> PrefixForest::ChunkTokens(ChunkId chunk) const {
  if (!allocator_.IsAllocated(chunk)) return {};
  return NodeTokens(chunk);
}

int32_t PrefixForest::ChunkComputed(ChunkId chunk) const {
  return allocator_.IsAllocated(chunk) ? nodes_[chunk].num_computed : 0;
}

bool PrefixForest::IsBlock(ChunkId chunk) const { return ChunkComputed(chunk) == chunk_size_; }

ChunkId PrefixForest::ChunkParent(ChunkId chunk) const {
  if (!allocator_.IsAllocated(chunk) || IsRoot(nodes_[chunk].parent)) return -1;
  return nodes_[chunk].parent;
}

std::string_view PrefixForest::ChunkNamespace(ChunkId chunk) const {
  if (!allocator_.IsAllocated(chunk)) return {};
  NodeId id = chunk;
  while (!IsRoot(id)) id = nodes_[id].parent;
  return root_names_[id - capacity()];
}

int32_t PrefixForest::RefCount(ChunkId chunk) const {
  return allocator_.IsAllocated(chunk) ? nodes_[chunk].refcount : 0;
}

std::vector<std::pair<std::string, int32_t>> PrefixForest::ChunksPerNamespace() const {
  std::vector<std::pair<std::string, int32_t>> out;
  for (const auto& [ns, root] : roots_) {
    if (nodes_[root].chunks > 0) out.emplace_back(ns, nodes_[root].chunks);
  }
  return out;
}

CacheStats PrefixForest::stats() const {
  CacheStats s = stats_;
  s.capacity_chunks = capacity();
  s.free_chunks = allocator_.num_free();
  s.live_sequences = static_cast<int64_t>(seqs_.size());
  s.oldest_cached_seconds = absl::ToDoubleSeconds(lru_.OldestAge());
  s.band_chunks[static_cast<int>(RetentionBand::kDefault)] =
      s.used_chunks + s.cached_chunks - s.band_chunks[static_cast<int>(RetentionBand::kHigh)];
  return s;
}

absl::Status PrefixForest::CheckInvariants() const {
  const int c = chunk_size_;
  // Refcounts from the sequences' paths.
  std::vector<int32_t> holders(nodes_.size(), 0);
  int64_t logical = 0;
  for (const auto& [id, s] : seqs_) {
    if (s->path.empty()) return InvariantError("sequence %d has no chunk", id);
    if (static_cast<int64_t>(s->path.size()) != CeilDiv(s->len, c)) {
      return InvariantError("sequence %d: %d tokens in %d chunks", id, s->len, s->path.size());
    }
    NodeId parent = s->root;
    for (size_t k = 0; k < s->path.size(); ++k) {
      const NodeId n = s->path[k];
      if (!allocator_.IsAllocated(n) || !nodes_[n].live) {
        return InvariantError("sequence %d holds dead chunk %d", id, n);
      }
      if (nodes_[n].parent != parent) {
        return InvariantError("sequence %d: chunk %d is not a child of %d", id, n, parent);
      }
      const int32_t want = std::min<int32_t>(c, s->len - static_cast<int32_t>(k) * c);
      if (nodes_[n].num_tokens != want) {
        return InvariantError("sequence %d: chunk %d holds %d tokens, expected %d", id, n, nodes_[n].num_tokens, want);
      }
      ++holders[n];
      parent = n;
    }
    const auto& tails = nodes_[s->path.back()].tails;
    if (s->tail_pos < 0 || s->tail_pos >= static_cast<int32_t>(tails.size()) || tails[s->tail_pos] != s.get()) {
      return InvariantError("sequence %d missing from its tail's list", id);
    }
    ++holders[s->root];
    logical += s->len;
  }
  int32_t used = 0, cached = 0, shared = 0;
  int64_t physical = 0, cached_tokens = 0, tails = 0;
  std::vector<int32_t> root_chunks(nodes_.size(), 0);
  std::vector<int32_t> root_raised(nodes_.size(), 0);
  int32_t band[kNumRetentionBands] = {};
  for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    const bool root = IsRoot(id);
    if (!root && allocator_.IsAllocated(id) != n.live) {
      return InvariantError("chunk %d: allocator and tree disagree", id);
    }
    if (!n.live) continue;
    if (n.refcount != holders[id]) {
      return InvariantError("node %d: refcount %d, held by %d", id, n.refcount, holders[id]);
    }
    tails += static_cast<int64_t>(n.tails.size());
    if (!n.children.empty() && n.num_tokens != c) return InvariantError("partial chunk %d has children", id);
    for (size_t j = 0; j < n.children.size(); ++j) {
      const Node& ch = nodes_[n.children[j]];
      if (ch.parent != id || ch.pos_in_parent != static_cast<int32_t>(j)) {
        return InvariantError("child %d of %d misplaced", n.children[j], id);
      }
      if (j > 0 && TokensLess(n.children[j], n.children[j - 1])) {
        return InvariantError("children of %d out of order", id);
      }
    }
    if (root) {
      if (n.refcount == 0 && n.children.empty()) return InvariantError("empty root %d kept", id);
      continue;
    }
    const NodeId want_root = IsRoot(n.parent) ? n.parent : nodes_[n.parent].root;
    if (n.root != want_root) return InvariantError("chunk %d: root %d, its parent's is %d", id, n.root, want_root);
    ++root_chunks[n.root];
    if (n.num_tokens < 1 || n.num_tokens > c) return InvariantError("chunk %d holds %d tokens", id, n.num_tokens);
    if (n.num_computed < 0 || n.num_computed > n.num_tokens) {
      return InvariantError("chunk %d: %d of %d tokens computed", id, n.num_computed, n.num_tokens);
    }
    if (n.refcount == 0 && n.num_computed != n.num_tokens) {
      return InvariantError("cached chunk %d has uncomputed tokens", id);
    }
    if (n.num_computed > 0 && !IsRoot(n.parent) && nodes_[n.parent].num_computed != c) {
      return InvariantError("chunk %d computed below an uncomputed parent", id);
    }
    if (n.parent == kNone || nodes_[n.parent].children[n.pos_in_parent] != id) {
      return InvariantError("chunk %d not linked from its parent", id);
    }
    if (!IsRoot(n.parent) && lru_.Priority(id) > lru_.Priority(n.parent)) {
      return InvariantError("chunk %d: retention priority %d above its parent's %d", id, lru_.Priority(id),
                            lru_.Priority(n.parent));
    }
    ++band[static_cast<int>(BandOf(lru_.Priority(id)))];
    root_raised[n.root] += lru_.Priority(id) > kDefaultRetentionPriority;
    if (lru_.contains(id) != (n.refcount == 0)) {
      return InvariantError("chunk %d: refcount %d but cached %d", id, n.refcount, lru_.contains(id));
    }
    if (n.refcount > 0) {
      ++used;
      physical += n.num_tokens;
      shared += n.refcount >= 2;
    } else {
      ++cached;
      cached_tokens += n.num_tokens;
    }
  }
  int32_t lru_len = 0;
  std::vector<int32_t> lru_rank(capacity(), -1);
  for (NodeId id = static_cast<NodeId>(lru_.Victim()), prev = kNone; id != kNone;
       prev = id, id = static_cast<NodeId>(lru_.Next(id))) {
    if (lru_.Prev(id) != prev) return InvariantError("cached list broken at %d", id);
    if (lru_len >= cached) return InvariantError("cached list longer than %d", cached);
    lru_rank[id] = lru_len++;
  }
  if (lru_len != cached || lru_.size() != cached) {
    return InvariantError("cached list has %d (size %d) of %d cached chunks", lru_len, lru_.size(), cached);
  }
  // Eviction takes the head, so a cached chunk must come before its cached parent.
  for (NodeId id = 0; id < capacity(); ++id) {
    const NodeId parent = nodes_[id].parent;
    if (lru_rank[id] >= 0 && parent != kNone && !IsRoot(parent) && lru_rank[parent] >= 0 &&
        lru_rank[parent] < lru_rank[id]) {
      return InvariantError("cached chunk %d is older than its cached parent %d", parent, id);
    }
  }
  for (NodeId id = capacity(); id < static_cast<NodeId>(nodes_.size()); ++id) {
    if (nodes_[id].chunks != root_chunks[id]) {
      return InvariantError("root %d counts %d chunks, holds %d", id, nodes_[id].chunks, root_chunks[id]);
    }
    if (nodes_[id].raised != root_raised[id]) {
      return InvariantError("root %d counts %d raised chunks, holds %d", id, nodes_[id].raised, root_raised[id]);
    }
  }
  if (tails != static_cast<int64_t>(seqs_.size())) {
    return InvariantError("%d tails for %d sequences", tails, seqs_.size());
  }
  if (used != stats_.used_chunks || cached != stats_.cached_chunks || shared != stats_.shared_chunks ||
      physical != stats_.physical_tokens || cached_tokens != stats_.cached_tokens ||
      logical != stats_.logical_tokens) {
    return InvariantError("counters drifted: used %d/%d cached %d/%d shared %d/%d physical %d/%d cached_tokens %d/%d "
                "logical %d/%d",
                used, stats_.used_chunks, cached, stats_.cached_chunks, shared, stats_.shared_chunks, physical,
                stats_.physical_tokens, cached_tokens, stats_.cached_tokens, logical, stats_.logical_tokens);
  }
  if (const int high = static_cast<int>(RetentionBand::kHigh); band[high] != stats_.band_chunks[high]) {
    return InvariantError("high retention band counts %d chunks, holds %d", stats_.band_chunks[high], band[high]);
  }
  if (used + cached + allocator_.num_free() != capacity()) {
    return InvariantError("used %d + cached %d + free %d != capacity %d", used, cached, allocator_.num_free(),
                          capacity());
  }
  for (const auto& [name, r] : roots_) {
    if (!nodes_[r].live || root_names_[r - capacity()] != name) {
      return InvariantError("namespace '%s' lost its root", name);
    }
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
