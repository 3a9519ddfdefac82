// A walk of mixed operations on a small prefix forest, checked after every
// step against a brute-force model; each choice comes from a source, so the
// unit test drives it with a seeded generator and tests/fuzz/ with arbitrary bytes.
// Failures are GoogleTest assertions (outside a test, GoogleTest records
// them all the same: the fuzzer reads them back).
//
// The model and what is checked:
//  - the model keeps every live sequence's tokens; the forest must read them
//    back exactly;
//  - a shadow KV pool holds, per slot, the token whose KV a worker would have
//    written there: the test applies each reported KvCopy and writes the
//    tokens the forest says need KV only when their step runs (MarkComputed),
//    so sequences removed before that (cancelled prefills) leave nothing.
//    Every matched or computed position of every live sequence must then read
//    its own token from the shadow pool, which proves that matched tokens
//    really were cached, that copies are complete, and that no chunk is read
//    by two sequences that disagree on its tokens; every cached chunk must
//    hold exactly the KV of its tokens;
//  - writes only ever land in chunks no other live sequence holds;
//  - a chunk written for one namespace is never read by another;
//  - matched tokens are at least the longest common prefix with any live
//    sequence of the namespace, or any removed one when nothing was evicted
//    since it left;
//  - used + cached + free == capacity, and the (C, i, j) context describes
//    exactly the sequences' paths with every chunk's readers contiguous;
//  - with retention on: the model keeps every grant a chunk was given (all
//    of them, not the forest's reduced set) on a clock the walk advances;
//    each chunk's priority must be the highest running grant's (or the
//    default), Retain must grant and cap exactly the chunks the model says
//    (the bound counted by brute force over the namespace), and every chunk
//    an operation evicts must have a priority no higher than any chunk that
//    stayed cached through it.
#ifndef CHUNKATTN_SERVICES_TESTS_FOREST_WALK_H_
#define CHUNKATTN_SERVICES_TESTS_FOREST_WALK_H_

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "gtest/gtest.h"
#include "services/core/prefix_forest.h"

namespace chunkattn {
namespace testing {

struct WalkParams {
  int chunk_size;
  int32_t pool_chunks;
  bool record_block_events = false;  // for TakeBlockEvents (the KV-event tests)
  bool retention = false;            // Retain calls and a clock that moves (checked against the model)
};

// One seeded walk of a parameterized test.
struct WalkCase {
  WalkParams params;
  int steps;
  uint32_t seed;
};

// Every choice of the walk: an integer in [lo, hi]. A seeded generator in the
// unit test, the fuzzer's bytes in tests/fuzz/.
using UniformSource = std::function<int(int lo, int hi)>;

class RandomWalk {
 public:
  RandomWalk(const WalkParams& p, UniformSource uniform)
      : p_(p), uniform_(std::move(uniform)), shadow_(static_cast<size_t>(p.pool_chunks) * p.chunk_size, -1),
        shadow_ns_(p.pool_chunks, -1) {
    forest_ = PrefixForest::Create({p.chunk_size, p.pool_chunks, 4096, &clock_}).value();
    grants_.resize(p.pool_chunks);
    state_.assign(p.pool_chunks, PrefixForest::ChunkState::kFree);
    forest_->set_record_block_events(p.record_block_events);
    // Base prompts reused across namespaces: the same tokens in two
    // namespaces must still never share a chunk.
    for (int i = 0; i < 6; ++i) bases_.push_back(RandomTokens(Uniform(0, 5 * p.chunk_size)));
  }

  // One operation chosen by the source, then every check.
  void Step() {
    ++step_;
    if (p_.retention) {
      clock_.Advance(absl::Milliseconds(Uniform(0, 1500)));
      BeginOp();
      if (Uniform(0, 9) < 2 && !live_.empty()) {
        DoRetain();
        if (::testing::Test::HasFailure()) return;
        CheckAll();
        return;
      }
    }
    const int r = Uniform(0, 99);
    if (live_.size() < 2 || r < 30) {
      DoInsert();
    } else if (r < 60) {
      DoAppend();
    } else if (r < 65) {
      DoFork();
    } else if (r < 85) {
      DoRemove(Pick());
    } else if (r < 95) {
      for (auto& [id, seq] : live_) Compute(id);
    } else {
      forest_->EvictCached(Uniform(1, 6));
      NoteEvictions();
    }
    if (::testing::Test::HasFailure()) return;
    CheckAll();
  }

  // Everyone leaves, everything is evicted: the pool must be full again.
  void Finish() {
    while (!live_.empty() && !::testing::Test::HasFailure()) DoRemove(live_.begin()->first);
    forest_->EvictCached(p_.pool_chunks);
    const CacheStats s = forest_->stats();
    EXPECT_EQ(s.free_chunks, p_.pool_chunks);
    EXPECT_EQ(s.used_chunks + s.cached_chunks, 0);
    EXPECT_EQ(s.logical_tokens, 0);
    EXPECT_TRUE(forest_->CheckInvariants().ok()) << forest_->CheckInvariants();
  }

  // What the walk visited, for a test that must see every kind of event.
  struct Visited {
    int inserts_ok, cancelled, copies, exhausted;
    int retained = 0, capped = 0;  // Retain calls, and those the bound cut
    int64_t band_evictions[kNumRetentionBands] = {};  // chunks evicted, by the model's band
  };
  Visited visited() const {
    Visited v{inserts_ok_, cancelled_, copies_, exhausted_, retained_, capped_};
    std::copy(std::begin(band_evictions_), std::end(band_evictions_), std::begin(v.band_evictions));
    return v;
  }
  const PrefixForest& forest() const { return *forest_; }
  std::vector<BlockEvent> TakeBlockEvents() { return forest_->TakeBlockEvents(); }

 private:
  struct Seq {
    std::vector<TokenId> tokens;
    int ns;
    int32_t valid = 0;   // leading positions whose KV is in the shadow pool
    int32_t marked = 0;  // leading positions reported computed to the forest
  };

  int Uniform(int lo, int hi) { return uniform_(lo, hi); }
  // A tiny vocabulary makes accidental partial matches inside chunks common.
  std::vector<TokenId> RandomTokens(int n) {
    std::vector<TokenId> t(n);
    for (auto& x : t) x = Uniform(0, 3);
    return t;
  }
  SeqId Pick() {
    auto it = live_.begin();
    std::advance(it, Uniform(0, static_cast<int>(live_.size()) - 1));
    return it->first;
  }
  static std::string NsName(int ns) { return ns == 0 ? "" : "tenant-" + std::to_string(ns); }

  void NoteEvictions() {
    const int64_t ev = forest_->stats().total_evictions;
    if (ev != evictions_seen_) removed_.clear();  // their chunks may be gone
    evictions_seen_ = ev;
  }

  // Mirrors a worker at the start of a step: copies come before any write.
  void ApplyCopies(const std::vector<KvCopy>& copies, int ns) {
    const int c = p_.chunk_size;
    for (const KvCopy& k : copies) {
      ASSERT_EQ(shadow_ns_[k.src_chunk], ns) << "step " << step_ << ": copy from another namespace";
      ASSERT_EQ(forest_->RefCount(k.dst_chunk), 1) << "step " << step_;
      std::copy_n(shadow_.begin() + int64_t{k.src_chunk} * c, k.num_tokens, shadow_.begin() + int64_t{k.dst_chunk} * c);
      shadow_ns_[k.dst_chunk] = ns;
    }
  }

  // The step that computes sequence `id` runs: the worker writes the KV of
  // its pending tokens, then the forest is told.
  void Compute(SeqId id) {
    const int c = p_.chunk_size;
    Seq& s = live_.at(id);
    const int32_t len = static_cast<int32_t>(s.tokens.size());
    std::vector<int64_t> slots;
    ASSERT_TRUE(forest_->Slots(id, s.valid, len, &slots).ok());
    for (size_t k = 0; k < slots.size(); ++k) {
      const ChunkId chunk = static_cast<ChunkId>(slots[k] / c);
      const TokenId token = s.tokens[s.valid + k];
      // Forks share pending slots: a second write must be the same token.
      if (forest_->RefCount(chunk) > 1) {
        ASSERT_EQ(forest_->ChunkTokens(chunk)[slots[k] % c], token) << "step " << step_;
      }
      shadow_[slots[k]] = token;
      shadow_ns_[chunk] = s.ns;
    }
    ASSERT_TRUE(forest_->MarkComputed(id).ok());
    s.valid = s.marked = len;
  }

  void DoInsert() {
    const int ns = Uniform(0, 2);
    std::vector<TokenId> prompt;
    const int kind = Uniform(0, 9);
    if (kind < 6) {
      const auto& base = bases_[Uniform(0, static_cast<int>(bases_.size()) - 1)];
      prompt.assign(base.begin(), base.begin() + Uniform(0, static_cast<int>(base.size())));
    } else if (kind < 9 && !live_.empty()) {  // a follow-up turn of a live conversation
      const auto& t = live_.at(Pick()).tokens;
      prompt.assign(t.begin(), t.begin() + Uniform(0, static_cast<int>(t.size())));
    } else if (!removed_.empty()) {  // a retry of a finished one
      prompt = removed_[Uniform(0, static_cast<int>(removed_.size()) - 1)].tokens;
    }
    const auto suffix = RandomTokens(Uniform(prompt.empty() ? 1 : 0, 2 * p_.chunk_size));
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());

    int32_t lower = 0;  // longest computed prefix that must be found
    auto consider = [&](const Seq& s) {
      if (s.ns != ns) return;
      const size_t n = std::min<size_t>(s.marked, prompt.size());
      const int32_t l = static_cast<int32_t>(std::mismatch(prompt.begin(), prompt.begin() + n, s.tokens.begin()).first -
                                             prompt.begin());
      lower = std::max(lower, l);
    };
    for (const auto& [id, s] : live_) consider(s);
    for (const Seq& s : removed_) consider(s);

    const CacheStats before = forest_->stats();
    auto r = forest_->Insert(prompt, NsName(ns));
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
      const int64_t chunks = (prompt.size() + p_.chunk_size - 1) / p_.chunk_size;
      ASSERT_GT(chunks, before.free_chunks) << "step " << step_ << ": refused with room: " << r.status();
      ExpectUnchanged(before);
      ++exhausted_;
      return;
    }
    ++inserts_ok_;
    NoteEvictions();
    {
      const auto path = forest_->Chunks(r->seq_id).value();
      for (size_t k = (r->matched_tokens + p_.chunk_size - 1) / p_.chunk_size; k < path.size(); ++k) Fresh(path[k]);
      for (const KvCopy& copy : r->copies) Fresh(copy.dst_chunk), pinned_.push_back(copy.src_chunk);
    }
    ASSERT_GE(r->matched_tokens, lower) << "step " << step_ << ": missed a cached prefix";
    ASSERT_LE(r->matched_tokens, static_cast<int32_t>(prompt.size()));
    copies_ += static_cast<int>(r->copies.size());
    // Tokens matched in whole chunks count as computed at once (a prompt
    // found whole in the cache may be extended before any step: the fuzzer
    // found the model saying otherwise); those matched in a partial chunk
    // (copied, or the chunk taken over) count once the step runs.
    const int32_t whole = r->matched_tokens - r->matched_tokens % p_.chunk_size;
    live_[r->seq_id] = Seq{prompt, ns, r->matched_tokens, whole};
    ApplyCopies(r->copies, ns);
    if (Uniform(0, 9) < 7) Compute(r->seq_id);  // else: computed later, or cancelled first
  }

  void DoAppend() {
    const SeqId id = Pick();
    Seq& s = live_.at(id);
    if (s.marked < static_cast<int32_t>(s.tokens.size())) {
      if (Uniform(0, 9) == 0) {  // decoding before the prefill ran is refused
        ASSERT_EQ(forest_->Append(id, {1}).status().code(), absl::StatusCode::kFailedPrecondition);
        return;
      }
      Compute(id);
    }
    std::vector<TokenId> more;
    const int kind = Uniform(0, 9);
    if (kind < 6) {
      more = RandomTokens(1);
    } else if (kind < 8) {
      more = RandomTokens(Uniform(1, 3 * p_.chunk_size));
    } else {  // follow another sequence's continuation, to make equal siblings
      const auto& o = live_.at(Pick()).tokens;
      if (o.size() > s.tokens.size()) more.assign(o.begin() + s.tokens.size(), o.end());
      if (more.empty()) more = RandomTokens(1);
    }
    if (s.tokens.size() + more.size() > 4096) return;
    const CacheStats before = forest_->stats();
    auto r = forest_->Append(id, more);
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
      const int64_t chunks = 1 + (more.size() + p_.chunk_size - 1) / p_.chunk_size;
      ASSERT_GT(chunks, before.free_chunks) << "step " << step_ << ": refused with room: " << r.status();
      ExpectUnchanged(before);
      ASSERT_EQ(*forest_->Length(id), static_cast<int32_t>(s.tokens.size()));
      ++exhausted_;
      return;
    }
    NoteEvictions();
    {
      const auto path = forest_->Chunks(id).value();
      for (size_t k = (s.tokens.size() + p_.chunk_size - 1) / p_.chunk_size; k < path.size(); ++k) Fresh(path[k]);
      for (const KvCopy& copy : r->copies) Fresh(copy.dst_chunk);
    }
    copies_ += static_cast<int>(r->copies.size());
    if (!r->copies.empty()) {
      // Copy-on-write of the shared tail: the copy runs with the next step, so
      // until then the tail's tokens are not cached anywhere this sequence can
      // vouch for (the fuzzer found the model saying otherwise).
      s.marked -= s.marked % p_.chunk_size;
    }
    s.tokens.insert(s.tokens.end(), more.begin(), more.end());
    ApplyCopies(r->copies, s.ns);
    if (Uniform(0, 9) < 8) Compute(id);
  }

  void DoFork() {
    const SeqId id = Pick();
    auto r = forest_->Fork(id, Uniform(1, 3));
    ASSERT_TRUE(r.ok()) << r.status();
    for (SeqId child : *r) live_[child] = live_.at(id);
  }

  void DoRemove(SeqId id) {
    ASSERT_TRUE(forest_->Remove(id).ok());
    cancelled_ += live_.at(id).marked < static_cast<int32_t>(live_.at(id).tokens.size());
    removed_.push_back(live_.at(id));
    live_.erase(id);
    if (removed_.size() > 64) removed_.erase(removed_.begin());
  }

  void ExpectUnchanged(const CacheStats& before) {
    const CacheStats after = forest_->stats();
    EXPECT_EQ(after.used_chunks, before.used_chunks) << "step " << step_;
    EXPECT_EQ(after.cached_chunks, before.cached_chunks) << "step " << step_;
    EXPECT_EQ(after.total_evictions, before.total_evictions) << "step " << step_;
    EXPECT_EQ(after.logical_tokens, before.logical_tokens) << "step " << step_;
  }

  // Retention's model (p_.retention): every grant each chunk has, raw.
  int32_t ModelPriority(ChunkId chunk) const {
    int32_t p = -1;
    for (const RetentionGrant& g : grants_[chunk]) {
      if (g.until > clock_.Now()) p = std::max(p, g.priority);
    }
    return p < 0 ? kDefaultRetentionPriority : p;
  }
  // A chunk this operation allocated (it was free, or evicted first): no grant.
  void Fresh(ChunkId chunk) {
    fresh_.push_back(chunk);
    grants_[chunk].clear();
  }
  void BeginOp() {
    evictions_before_ = forest_->stats().total_evictions;
    fresh_.clear();
    pinned_.clear();
    priority_before_.assign(p_.pool_chunks, 0);
    for (ChunkId c = 0; c < p_.pool_chunks; ++c) priority_before_[c] = ModelPriority(c);
  }

  void DoRetain() {
    const SeqId id = Pick();
    const Seq& s = live_.at(id);
    const int32_t len = static_cast<int32_t>(s.tokens.size());
    const int32_t prefix = Uniform(1, len);
    static constexpr int32_t kPriorities[] = {35, 50, 80, 100};
    RetentionGrant g;
    g.priority = kPriorities[Uniform(0, 3)];
    if (Uniform(0, 3) > 0) g.until = clock_.Now() + absl::Milliseconds(Uniform(1, 20000));
    const int32_t max_raised = Uniform(0, p_.pool_chunks / 2);
    // The model: root first, a chunk lifted past the default counts, stop at the bound.
    const auto path = forest_->Chunks(id).value();
    const int32_t chunks = (prefix + p_.chunk_size - 1) / p_.chunk_size;
    int32_t budget = max_raised, granted = 0, capped = 0;
    for (int32_t k = 0; k < chunks; ++k) {
      if (g.priority > kDefaultRetentionPriority && ModelPriority(path[k]) <= kDefaultRetentionPriority) {
        if (budget == 0) {
          capped = chunks - k;
          break;
        }
        --budget;
      }
      grants_[path[k]].push_back(g);
      ++granted;
    }
    auto r = forest_->Retain(id, prefix, g, max_raised);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->chunks, granted) << "step " << step_;
    ASSERT_EQ(r->capped_chunks, capped) << "step " << step_;
    ++retained_;
    capped_ += capped > 0;
    // Bad calls change nothing.
    ASSERT_EQ(forest_->Retain(id, len + 1, g, 1).status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_EQ(forest_->Retain(id, 0, g, 1).status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_EQ(forest_->Retain(id, 1, {101, g.until}, 1).status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_EQ(forest_->Retain(id, 1, {34, g.until}, 1).status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_EQ(forest_->Retain(id, 1, g, -1).status().code(), absl::StatusCode::kInvalidArgument);
  }

  // Retention's checks: priorities as the model says, evictions lowest first.
  void CheckRetention() {
    forest_->ExpireRetention();
    std::vector<PrefixForest::ChunkState> now(p_.pool_chunks);
    for (ChunkId c = 0; c < p_.pool_chunks; ++c) {
      now[c] = forest_->State(c);
      if (now[c] == PrefixForest::ChunkState::kFree) grants_[c].clear();
    }
    if (forest_->stats().total_evictions > evictions_before_) {
      auto fresh = [&](ChunkId c) { return std::find(fresh_.begin(), fresh_.end(), c) != fresh_.end(); };
      auto pinned = [&](ChunkId c) { return std::find(pinned_.begin(), pinned_.end(), c) != pinned_.end(); };
      int32_t evicted_max = -1, kept_min = kMaxRetentionPriority + 1;
      for (ChunkId c = 0; c < p_.pool_chunks; ++c) {
        if (state_[c] != PrefixForest::ChunkState::kCached) continue;
        if (now[c] == PrefixForest::ChunkState::kFree || fresh(c)) {
          evicted_max = std::max(evicted_max, priority_before_[c]);
          ++band_evictions_[static_cast<int>(BandOf(priority_before_[c]))];
        } else if (now[c] == PrefixForest::ChunkState::kCached && !pinned(c)) {
          kept_min = std::min(kept_min, priority_before_[c]);
        }
      }
      ASSERT_LE(evicted_max, kept_min) << "step " << step_ << ": evicted a chunk of priority " << evicted_max
                                       << " while one of " << kept_min << " stayed cached";
    }
    int32_t band[kNumRetentionBands] = {};
    for (ChunkId c = 0; c < p_.pool_chunks; ++c) {
      if (now[c] == PrefixForest::ChunkState::kFree) continue;
      ASSERT_EQ(forest_->ChunkPriority(c), ModelPriority(c)) << "step " << step_ << " chunk " << c;
      ++band[static_cast<int>(BandOf(ModelPriority(c)))];
    }
    const CacheStats s = forest_->stats();
    for (int b = 0; b < kNumRetentionBands; ++b) ASSERT_EQ(s.band_chunks[b], band[b]) << "step " << step_;
    state_ = std::move(now);
  }

  void CheckAll() {
    const int c = p_.chunk_size;
    if (p_.retention) {
      CheckRetention();
      if (::testing::Test::HasFailure()) return;
    }
    ASSERT_TRUE(forest_->CheckInvariants().ok()) << "step " << step_ << ": " << forest_->CheckInvariants();
    const CacheStats s = forest_->stats();
    ASSERT_EQ(s.used_chunks + s.cached_chunks + s.free_chunks, p_.pool_chunks);
    ASSERT_EQ(s.live_sequences, static_cast<int64_t>(live_.size()));

    std::map<ChunkId, int> chunk_ns;
    std::map<SeqId, std::vector<ChunkId>> paths;
    int64_t logical = 0;
    for (const auto& [id, seq] : live_) {
      ASSERT_EQ(forest_->Tokens(id).value(), seq.tokens) << "step " << step_ << " seq " << id;
      const auto chunks = forest_->Chunks(id).value();
      for (int32_t p = 0; p < seq.valid; ++p) {
        const ChunkId chunk = chunks[p / c];
        ASSERT_EQ(shadow_[int64_t{chunk} * c + p % c], seq.tokens[p])
            << "step " << step_ << " seq " << id << " position " << p << ": KV slot holds another token";
      }
      for (size_t k = 0; k < chunks.size(); ++k) {
        const ChunkId chunk = chunks[k];
        if (static_cast<int32_t>(k) * c < seq.valid) {
          ASSERT_EQ(shadow_ns_[chunk], seq.ns) << "step " << step_;
        }
        auto [it, fresh] = chunk_ns.emplace(chunk, seq.ns);
        ASSERT_EQ(it->second, seq.ns) << "step " << step_ << ": chunk " << chunk << " in two namespaces";
      }
      paths[id] = chunks;
      logical += static_cast<int64_t>(seq.tokens.size());
    }
    ASSERT_EQ(s.logical_tokens, logical);
    // Computed slots must hold what they claim, or a later hit would be wrong;
    // cached chunks are computed in full.
    for (ChunkId chunk = 0; chunk < p_.pool_chunks; ++chunk) {
      const auto t = forest_->ChunkTokens(chunk);
      const int32_t computed = forest_->ChunkComputed(chunk);
      if (forest_->State(chunk) == PrefixForest::ChunkState::kCached) {
        ASSERT_EQ(computed, static_cast<int32_t>(t.size())) << "step " << step_;
      }
      for (int32_t k = 0; k < computed; ++k) {
        ASSERT_EQ(shadow_[int64_t{chunk} * c + k], t[k]) << "step " << step_ << ": chunk " << chunk;
      }
    }

    // The context: valid, one entry per live sequence, true paths, and every
    // chunk's readers contiguous.
    const ChunkContext& ctx = forest_->Context();
    ASSERT_TRUE(ValidateChunkContext(ctx, p_.pool_chunks).ok()) << ValidateChunkContext(ctx, p_.pool_chunks);
    ASSERT_EQ(ctx.num_seqs(), static_cast<int>(live_.size()));
    std::map<ChunkId, std::vector<int>> readers;
    std::set<SeqId> seen;
    for (int i = 0; i < ctx.num_seqs(); ++i) {
      const SeqId id = ctx.seq_ids[i];
      ASSERT_TRUE(seen.insert(id).second);
      ASSERT_EQ(SequenceChunks(ctx, i), paths.at(id)) << "step " << step_;
      ASSERT_EQ(ctx.seq_len[i], static_cast<int32_t>(live_.at(id).tokens.size()));
      for (ChunkId chunk : paths.at(id)) readers[chunk].push_back(i);
    }
    std::map<ChunkId, std::pair<int, int>> shared_ranges;
    for (int k = 0; k < ctx.num_shared(); ++k) {
      shared_ranges[ctx.shared_chunk[k]] = {ctx.shared_begin[k], ctx.shared_end[k]};
    }
    for (const auto& [chunk, idx] : readers) {
      ASSERT_EQ(idx.back() - idx.front() + 1, static_cast<int>(idx.size()))
          << "step " << step_ << ": readers of chunk " << chunk << " not contiguous";
      if (idx.size() >= 2) {
        ASSERT_EQ(shared_ranges.at(chunk), std::make_pair(idx.front(), idx.back() + 1)) << "step " << step_;
      } else {
        ASSERT_EQ(shared_ranges.count(chunk), 0u);
      }
    }
  }

  const WalkParams p_;
  const UniformSource uniform_;
  ManualClock clock_;
  std::vector<std::vector<RetentionGrant>> grants_;  // (pool) every grant given since the chunk was allocated
  std::vector<PrefixForest::ChunkState> state_;      // (pool) as of the last check
  std::vector<int32_t> priority_before_;             // (pool) the model's priorities before this operation
  std::vector<ChunkId> fresh_, pinned_;              // this operation's new chunks, and its copy sources
  int64_t evictions_before_ = 0;
  int retained_ = 0, capped_ = 0;
  int64_t band_evictions_[kNumRetentionBands] = {};
  std::unique_ptr<PrefixForest> forest_;
  std::vector<std::vector<TokenId>> bases_;
  std::map<SeqId, Seq> live_;
  std::vector<Seq> removed_;  // left since the last eviction (at most 64)
  std::vector<int> shadow_;     // (pool * c) token whose KV each slot holds
  std::vector<int> shadow_ns_;  // (pool) namespace each chunk was written for
  int64_t evictions_seen_ = 0;
  int step_ = 0;  // operations so far, for messages
  int inserts_ok_ = 0;
  int copies_ = 0;
  int exhausted_ = 0;
  int cancelled_ = 0;  // removed with tokens whose KV was never computed
};

}  // namespace testing
}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_TESTS_FOREST_WALK_H_
