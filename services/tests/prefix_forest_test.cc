// Contract tests: one behaviour of PrefixForest per test, on chunk size 16.
#include "services/core/prefix_forest.h"

#include <map>
#include <numeric>

#include "gtest/gtest.h"

namespace chunkattn {
namespace {

constexpr int kC = 16;

std::vector<TokenId> Range(TokenId first, int n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Insert, then mark the prompt's KV computed, as the step that follows would.
absl::StatusOr<InsertResult> InsertComputed(PrefixForest* f, const std::vector<TokenId>& t,
                                            std::string_view ns = "") {
  auto r = f->Insert(t, ns);
  if (r.ok()) {
    EXPECT_TRUE(f->MarkComputed(r->seq_id).ok());
  }
  return r;
}

std::unique_ptr<PrefixForest> MakeForest(int32_t num_chunks, int chunk_size = kC) {
  auto f = PrefixForest::Create({chunk_size, num_chunks, 1 << 20});
  EXPECT_TRUE(f.ok()) << f.status();
  return std::move(f).value();
}

// Every call is followed by the step that computes its KV and a full
// consistency check.
class PrefixForestTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (forest_) {
      EXPECT_TRUE(forest_->CheckInvariants().ok()) << forest_->CheckInvariants();
    }
  }
  InsertResult Insert(const std::vector<TokenId>& t, std::string_view ns = "") {
    auto r = InsertComputed(forest_.get(), t, ns);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(forest_->CheckInvariants().ok()) << forest_->CheckInvariants();
    return r.ok() ? *r : InsertResult{};
  }
  AppendResult Append(SeqId s, const std::vector<TokenId>& t) {
    auto r = forest_->Append(s, t);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(forest_->MarkComputed(s).ok());
    EXPECT_TRUE(forest_->CheckInvariants().ok()) << forest_->CheckInvariants();
    return r.ok() ? *r : AppendResult{};
  }
  std::vector<ChunkId> Chunks(SeqId s) { return forest_->Chunks(s).value(); }
  std::vector<TokenId> Tokens(SeqId s) { return forest_->Tokens(s).value(); }

  std::unique_ptr<PrefixForest> forest_ = MakeForest(64);
};

TEST(PrefixForestCreateTest, RejectsBadOptions) {
  for (int c : {0, 8, 24, 48, 512}) {
    EXPECT_EQ(PrefixForest::Create({c, 10, 100}).status().code(), absl::StatusCode::kInvalidArgument) << c;
  }
  EXPECT_EQ(PrefixForest::Create({64, 0, 100}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrefixForest::Create({64, 10, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  for (int c : {16, 32, 64, 128, 256}) EXPECT_TRUE(PrefixForest::Create({c, 1, 1}).ok()) << c;
}

TEST_F(PrefixForestTest, FirstInsertAllocatesAlignedChunks) {
  const auto prompt = Range(100, 40);
  const InsertResult r = Insert(prompt);
  EXPECT_EQ(r.matched_tokens, 0);
  EXPECT_TRUE(r.copies.empty());
  EXPECT_EQ(Tokens(r.seq_id), prompt);
  const auto chunks = Chunks(r.seq_id);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(forest_->ChunkTokens(chunks[2]).size(), 8u);
  std::vector<int64_t> slots;
  ASSERT_TRUE(forest_->Slots(r.seq_id, 15, 18, &slots).ok());
  EXPECT_EQ(slots, (std::vector<int64_t>{chunks[0] * kC + 15, chunks[1] * kC + 0, chunks[1] * kC + 1}));
  const CacheStats s = forest_->stats();
  EXPECT_EQ(s.used_chunks, 3);
  EXPECT_EQ(s.free_chunks, 61);
  EXPECT_EQ(s.logical_tokens, 40);
  EXPECT_EQ(s.physical_tokens, 40);
}

TEST_F(PrefixForestTest, IdenticalPromptSharesEveryChunk) {
  const auto prompt = Range(100, 40);
  const InsertResult a = Insert(prompt);
  const InsertResult b = Insert(prompt);
  // All 40 tokens' KV exist: the partial tail is shared, not copied.
  EXPECT_EQ(b.matched_tokens, 40);
  EXPECT_TRUE(b.copies.empty());
  EXPECT_EQ(Chunks(a.seq_id), Chunks(b.seq_id));
  const CacheStats s = forest_->stats();
  EXPECT_EQ(s.used_chunks, 3);
  EXPECT_EQ(s.shared_chunks, 3);
  EXPECT_EQ(s.logical_tokens, 80);
  EXPECT_EQ(s.physical_tokens, 40);
}

TEST_F(PrefixForestTest, MatchEndingInsideAChunkCopiesTheSharedSlots) {
  const auto a_prompt = Range(100, 40);
  auto b_prompt = Range(100, 20);
  b_prompt.push_back(7);  // diverges at position 20, inside the second chunk
  const InsertResult a = Insert(a_prompt);
  const InsertResult b = Insert(b_prompt);
  EXPECT_EQ(b.matched_tokens, 20);
  const auto ca = Chunks(a.seq_id), cb = Chunks(b.seq_id);
  ASSERT_EQ(cb.size(), 2u);
  EXPECT_EQ(cb[0], ca[0]);
  EXPECT_NE(cb[1], ca[1]);
  ASSERT_EQ(b.copies.size(), 1u);
  EXPECT_EQ(b.copies[0], (KvCopy{ca[1], cb[1], 4}));
  EXPECT_EQ(Tokens(b.seq_id), b_prompt);
}

TEST_F(PrefixForestTest, PromptLongerThanALiveSequencesPartialTailCopiesIt) {
  const InsertResult a = Insert(Range(100, 40));
  const InsertResult b = Insert(Range(100, 45));
  EXPECT_EQ(b.matched_tokens, 40);
  const auto ca = Chunks(a.seq_id), cb = Chunks(b.seq_id);
  ASSERT_EQ(b.copies.size(), 1u);
  EXPECT_EQ(b.copies[0], (KvCopy{ca[2], cb[2], 8}));  // a keeps filling its own tail
  EXPECT_EQ(forest_->RefCount(ca[2]), 1);
}

TEST_F(PrefixForestTest, RemovedSequenceStaysCachedAndIsHitAgain) {
  const auto prompt = Range(100, 40);
  const InsertResult a = Insert(prompt);
  const auto chunks = Chunks(a.seq_id);
  ASSERT_TRUE(forest_->Remove(a.seq_id).ok());
  CacheStats s = forest_->stats();
  EXPECT_EQ(s.used_chunks, 0);
  EXPECT_EQ(s.cached_chunks, 3);
  EXPECT_EQ(s.cached_tokens, 40);
  for (ChunkId c : chunks) EXPECT_EQ(forest_->State(c), PrefixForest::ChunkState::kCached);

  const InsertResult b = Insert(prompt);
  EXPECT_EQ(b.matched_tokens, 40);
  EXPECT_TRUE(b.copies.empty());
  EXPECT_EQ(Chunks(b.seq_id), chunks);
  s = forest_->stats();
  EXPECT_EQ(s.cached_chunks, 0);
  EXPECT_EQ(s.total_prompt_tokens, 80);
  EXPECT_EQ(s.total_matched_tokens, 40);
}

TEST_F(PrefixForestTest, CachedPartialLeafIsTakenOverAndExtendedInPlace) {
  const InsertResult a = Insert(Range(100, 20));
  const auto chunks = Chunks(a.seq_id);
  ASSERT_TRUE(forest_->Remove(a.seq_id).ok());
  const InsertResult b = Insert(Range(100, 30));
  EXPECT_EQ(b.matched_tokens, 20);
  EXPECT_TRUE(b.copies.empty());
  EXPECT_EQ(Chunks(b.seq_id), chunks);
  EXPECT_EQ(forest_->ChunkTokens(chunks[1]).size(), 14u);
}

TEST_F(PrefixForestTest, NamespacesNeverShare) {
  const auto prompt = Range(100, 40);
  const InsertResult a = Insert(prompt, "tenant-a");
  const InsertResult b = Insert(prompt, "tenant-b");
  const InsertResult c = Insert(prompt);  // the shared namespace "" is a namespace too
  EXPECT_EQ(b.matched_tokens, 0);
  EXPECT_EQ(c.matched_tokens, 0);
  for (ChunkId x : Chunks(a.seq_id)) {
    for (ChunkId y : Chunks(b.seq_id)) EXPECT_NE(x, y);
    for (ChunkId y : Chunks(c.seq_id)) EXPECT_NE(x, y);
  }
  EXPECT_EQ(Insert(prompt, "tenant-a").matched_tokens, 40);
}

TEST_F(PrefixForestTest, ChunksPerNamespaceCountsUsedAndCachedUntilFreed) {
  auto counts = [&] {
    auto v = forest_->ChunksPerNamespace();
    return std::map<std::string, int32_t>(v.begin(), v.end());
  };
  const InsertResult a = Insert(Range(100, 40), "t:a");    // 3 chunks
  const InsertResult b = Insert(Range(100, 40), "t:a/x");  // another namespace: 3 more
  const InsertResult a2 = Insert(Range(100, 20), "t:a");   // shares 1 full chunk, copies into 1
  EXPECT_EQ(counts(), (std::map<std::string, int32_t>{{"t:a", 4}, {"t:a/x", 3}}));
  ASSERT_TRUE(forest_->Remove(a.seq_id).ok());
  ASSERT_TRUE(forest_->Remove(a2.seq_id).ok());
  EXPECT_EQ(counts(), (std::map<std::string, int32_t>{{"t:a", 4}, {"t:a/x", 3}}));  // cached still counts
  EXPECT_EQ(forest_->EvictCached(64), 4);
  EXPECT_EQ(counts(), (std::map<std::string, int32_t>{{"t:a/x", 3}}));
  ASSERT_TRUE(forest_->Remove(b.seq_id).ok());
  EXPECT_EQ(forest_->EvictCached(64), 3);
  EXPECT_TRUE(counts().empty());
}

TEST_F(PrefixForestTest, AppendFillsTheTailThenGrowsAChunk) {
  const InsertResult a = Insert(Range(0, 14));
  EXPECT_TRUE(Append(a.seq_id, {50, 51}).copies.empty());
  EXPECT_EQ(Chunks(a.seq_id).size(), 1u);
  Append(a.seq_id, {52});
  EXPECT_EQ(Chunks(a.seq_id).size(), 2u);
  Append(a.seq_id, Range(60, 40));  // several chunks at once
  EXPECT_EQ(*forest_->Length(a.seq_id), 57);
  EXPECT_EQ(Chunks(a.seq_id).size(), 4u);
  EXPECT_EQ(Tokens(a.seq_id), Concat(Concat(Range(0, 14), {50, 51, 52}), Range(60, 40)));
}

TEST_F(PrefixForestTest, ForkSharesEverythingAndCopiesTheTailOnWrite) {
  const InsertResult a = Insert(Range(0, 20));
  const auto chunks = Chunks(a.seq_id);
  auto forks = forest_->Fork(a.seq_id, 2);
  ASSERT_TRUE(forks.ok()) << forks.status();
  ASSERT_EQ(forks->size(), 2u);
  EXPECT_EQ(forest_->RefCount(chunks[1]), 3);
  EXPECT_EQ(forest_->stats().logical_tokens, 60);
  EXPECT_EQ(forest_->stats().physical_tokens, 20);

  // The first two writers copy the shared partial tail; the last one owns it.
  const AppendResult r1 = Append((*forks)[0], {1000});
  ASSERT_EQ(r1.copies.size(), 1u);
  EXPECT_EQ(r1.copies[0].src_chunk, chunks[1]);
  EXPECT_EQ(r1.copies[0].num_tokens, 4);
  EXPECT_EQ(r1.copies.size(), 1u);
  EXPECT_EQ(Append((*forks)[1], {2000}).copies.size(), 1u);
  EXPECT_TRUE(Append(a.seq_id, {3000}).copies.empty());
  EXPECT_EQ(Chunks(a.seq_id), chunks);
  EXPECT_EQ(Tokens((*forks)[0]), Concat(Range(0, 20), {1000}));
  EXPECT_EQ(Tokens((*forks)[1]), Concat(Range(0, 20), {2000}));
  EXPECT_EQ(Tokens(a.seq_id), Concat(Range(0, 20), {3000}));
  EXPECT_EQ(forest_->RefCount(chunks[0]), 3);
}

TEST_F(PrefixForestTest, ForkAtAChunkBoundaryNeedsNoCopy) {
  const InsertResult a = Insert(Range(0, 32));
  auto forks = forest_->Fork(a.seq_id, 1);
  ASSERT_TRUE(forks.ok());
  EXPECT_TRUE(Append((*forks)[0], {7}).copies.empty());
  EXPECT_TRUE(Append(a.seq_id, {8}).copies.empty());
  EXPECT_EQ(forest_->stats().shared_chunks, 2);
}

TEST_F(PrefixForestTest, BadInputIsRejectedWithoutSideEffects) {
  const InsertResult a = Insert(Range(0, 10));
  const CacheStats before = forest_->stats();
  EXPECT_EQ(forest_->Insert({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forest_->Insert({1, -2, 3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forest_->Append(a.seq_id, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forest_->Append(a.seq_id, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forest_->Append(12345, {1}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(forest_->Remove(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(forest_->Fork(12345, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(forest_->Fork(a.seq_id, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forest_->Fork(a.seq_id, 5000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forest_->Tokens(12345).status().code(), absl::StatusCode::kNotFound);
  std::vector<int64_t> slots;
  EXPECT_EQ(forest_->Slots(a.seq_id, 5, 11, &slots).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forest_->Slots(a.seq_id, 3, 2, &slots).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(slots.empty());
  ASSERT_TRUE(forest_->Remove(a.seq_id).ok());
  EXPECT_EQ(forest_->Remove(a.seq_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(before.used_chunks, 1);
}

TEST(PrefixForestLimitsTest, MaxSeqLenAppliesToInsertAndAppend) {
  auto f = PrefixForest::Create({16, 16, 20}).value();
  EXPECT_EQ(f->Insert(Range(0, 21)).status().code(), absl::StatusCode::kInvalidArgument);
  auto r = InsertComputed(f.get(), Range(0, 20));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(f->Append(r->seq_id, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(f->CheckInvariants().ok());
}

TEST(PrefixForestMemoryTest, OutOfMemoryIsAtomicAndSaysWhatIsFree) {
  auto f = MakeForest(4);
  auto a = InsertComputed(f.get(), Range(0, 40));  // 3 chunks
  ASSERT_TRUE(a.ok());
  const auto r = f->Insert(Range(500, 33));  // needs 3, 1 free
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("needs 3 new chunks"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("only 1 are free and 0 cached"), std::string::npos) << r.status();
  EXPECT_EQ(f->stats().free_chunks, 1);
  // Appending past the last free chunk fails the same way and changes nothing.
  ASSERT_TRUE(f->Append(a->seq_id, Range(0, 24)).ok());  // 64 tokens, 4 chunks
  ASSERT_TRUE(f->MarkComputed(a->seq_id).ok());
  EXPECT_EQ(f->Append(a->seq_id, {1}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*f->Length(a->seq_id), 64);
  EXPECT_TRUE(f->CheckInvariants().ok()) << f->CheckInvariants();
}

TEST(PrefixForestMemoryTest, EvictsLeastRecentlyUsedLeavesOnlyWhenNeeded) {
  auto f = MakeForest(4);
  auto a = InsertComputed(f.get(), Range(0, 32)).value();    // chunks a0, a1
  auto b = InsertComputed(f.get(), Range(100, 32)).value();  // chunks b0, b1
  const auto ca = f->Chunks(a.seq_id).value(), cb = f->Chunks(b.seq_id).value();
  ASSERT_TRUE(f->Remove(a.seq_id).ok());
  ASSERT_TRUE(f->Remove(b.seq_id).ok());
  EXPECT_EQ(f->stats().cached_chunks, 4);
  // One new chunk: a's leaf goes first (least recently released), its root
  // chunk stays.
  auto c = InsertComputed(f.get(), Range(200, 10)).value();
  EXPECT_EQ(f->stats().total_evictions, 1);
  EXPECT_EQ(f->State(ca[1]), PrefixForest::ChunkState::kUsed);  // re-allocated to c
  EXPECT_EQ(f->Chunks(c.seq_id).value(), std::vector<ChunkId>{ca[1]});
  EXPECT_EQ(f->State(ca[0]), PrefixForest::ChunkState::kCached);
  // b is still fully cached.
  EXPECT_EQ(InsertComputed(f.get(), Range(100, 32)).value().matched_tokens, 32);
  EXPECT_TRUE(f->CheckInvariants().ok()) << f->CheckInvariants();
  (void)cb;
}

TEST(PrefixForestMemoryTest, MatchedCachedChunksAreNotEvictedToMakeRoomForTheirOwnInsert) {
  auto f = MakeForest(3);
  auto a = InsertComputed(f.get(), Range(0, 48)).value();  // 3 full chunks, the whole pool
  ASSERT_TRUE(f->Remove(a.seq_id).ok());
  // Shares 2 cached chunks and needs 2 more: only 1 of the 3 cached is evictable.
  auto r = f->Insert(Concat(Range(0, 32), Range(900, 20)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_EQ(f->stats().cached_chunks, 3);
  EXPECT_EQ(f->stats().total_evictions, 0);
  // Needing only 1 more works, by evicting the unshared third chunk.
  auto ok = InsertComputed(f.get(), Concat(Range(0, 32), Range(900, 10)));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->matched_tokens, 32);
  EXPECT_EQ(f->stats().total_evictions, 1);
  EXPECT_TRUE(f->CheckInvariants().ok()) << f->CheckInvariants();
}

TEST(PrefixForestMemoryTest, EvictCachedEmptiesThePool) {
  auto f = MakeForest(8);
  std::vector<SeqId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(InsertComputed(f.get(), Concat(Range(0, 20), {i}), "ns").value().seq_id);
  for (SeqId id : ids) ASSERT_TRUE(f->Remove(id).ok());
  EXPECT_GT(f->stats().cached_chunks, 0);
  EXPECT_EQ(f->EvictCached(1), 1);
  EXPECT_GT(f->EvictCached(1000), 0);
  const CacheStats s = f->stats();
  EXPECT_EQ(s.free_chunks, 8);
  EXPECT_EQ(s.cached_chunks, 0);
  EXPECT_TRUE(f->CheckInvariants().ok()) << f->CheckInvariants();
}

TEST_F(PrefixForestTest, DuplicateFullChunksDoNotHideALongerMatch) {
  // Two forks fill copies of one partial chunk with the same tokens: two equal
  // full siblings. Only the copy (ordered after the original) continues; a new
  // prompt must still find it.
  const InsertResult a = Insert(Range(0, 20));
  const SeqId b = forest_->Fork(a.seq_id, 1).value()[0];
  Append(b, Range(20, 12));         // copy-on-write, then full: 32 tokens
  Append(a.seq_id, Range(20, 12));  // a's own chunk, equal to b's
  Append(b, Range(32, 10));         // only b goes on
  ASSERT_TRUE(forest_->Remove(a.seq_id).ok());
  const InsertResult c = Insert(Range(0, 45));
  EXPECT_EQ(c.matched_tokens, 42);
  EXPECT_EQ(Chunks(c.seq_id)[1], Chunks(b)[1]);
}

TEST_F(PrefixForestTest, UncomputedKvIsNeitherMatchedNorKept) {
  const auto prompt = Range(100, 40);
  // Scheduled but not computed: a second identical prompt in the same step
  // must not read KV that does not exist yet.
  auto a = forest_->Insert(prompt);
  ASSERT_TRUE(a.ok());
  auto b = forest_->Insert(prompt);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->matched_tokens, 0);
  EXPECT_EQ(forest_->Append(a->seq_id, {1}).status().code(), absl::StatusCode::kFailedPrecondition);
  // a is cancelled before its prefill ran: its chunks are freed, not cached.
  const int32_t free_before = forest_->stats().free_chunks;
  ASSERT_TRUE(forest_->Remove(a->seq_id).ok());
  EXPECT_EQ(forest_->stats().free_chunks, free_before + 3);
  EXPECT_EQ(forest_->stats().cached_chunks, 0);
  // b computed only its first 20 tokens (a chunked prefill), then left: 20 stay.
  ASSERT_TRUE(forest_->MarkComputed(b->seq_id, 20).ok());
  EXPECT_EQ(*forest_->Computed(b->seq_id), 20);
  ASSERT_TRUE(forest_->Remove(b->seq_id).ok());
  EXPECT_EQ(forest_->stats().cached_tokens, 20);
  EXPECT_EQ(Insert(prompt).matched_tokens, 20);
  EXPECT_EQ(forest_->MarkComputed(12345).code(), absl::StatusCode::kNotFound);
}

TEST_F(PrefixForestTest, CopiedSlotsCountOnlyOnceTheStepRuns) {
  const InsertResult a = Insert(Range(100, 40));
  auto b = forest_->Insert(Range(100, 20));  // copies 4 slots of a's second chunk
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->copies.size(), 1u);
  const ChunkId copy = b->copies[0].dst_chunk;
  EXPECT_EQ(forest_->ChunkComputed(copy), 0);
  ASSERT_TRUE(forest_->Remove(b->seq_id).ok());  // cancelled: the copy never happened
  EXPECT_EQ(forest_->State(copy), PrefixForest::ChunkState::kFree);
  EXPECT_EQ(forest_->MarkComputed(a.seq_id, 41).code(), absl::StatusCode::kInvalidArgument);
}

// Equal sibling chunks of which only one is computed: a prompt must share or
// descend into the computed one, never read the other's missing KV.
TEST_F(PrefixForestTest, EqualPartialSiblingsShareOnlyTheComputedOne) {
  const InsertResult s = Insert(Range(0, 20));
  const SeqId f = forest_->Fork(s.seq_id, 1).value()[0];
  Append(s.seq_id, {20});  // copy-on-write: s moves to a new chunk, computed
  ASSERT_TRUE(forest_->Append(f, {20}).ok());  // in place, not computed yet
  const ChunkId uncomputed = Chunks(f)[1], computed = Chunks(s.seq_id)[1];
  ASSERT_NE(uncomputed, computed);
  const InsertResult b = Insert(Range(0, 21));
  EXPECT_EQ(b.matched_tokens, 21);
  EXPECT_EQ(Chunks(b.seq_id)[1], computed);
}

TEST_F(PrefixForestTest, EqualFullSiblingsDescendOnlyIntoTheComputedOne) {
  const InsertResult s = Insert(Range(0, 15));
  const SeqId f = forest_->Fork(s.seq_id, 1).value()[0];
  ASSERT_TRUE(forest_->Append(s.seq_id, {15}).ok());  // copy-on-write, not computed
  Append(f, {15});                                      // in place, computed
  const ChunkId computed = Chunks(f)[0];
  ASSERT_NE(Chunks(s.seq_id)[0], computed);
  const InsertResult b = Insert(Concat(Range(0, 16), {100}));
  EXPECT_EQ(b.matched_tokens, 16);
  EXPECT_EQ(Chunks(b.seq_id)[0], computed);
}

TEST_F(PrefixForestTest, SingleTokenPrompts) {
  const InsertResult a = Insert({5});
  const InsertResult b = Insert({5});
  EXPECT_EQ(b.matched_tokens, 1);
  EXPECT_EQ(Chunks(a.seq_id), Chunks(b.seq_id));
  EXPECT_EQ(Insert({6}).matched_tokens, 0);
}

TEST_F(PrefixForestTest, ContextFollowsFigure2) {
  // Three sequences share two full chunks; then each has its own tail.
  const auto system = Range(0, 32);
  const SeqId s0 = Insert(Concat(system, Range(100, 5))).seq_id;
  const SeqId s1 = Insert(Concat(system, Range(200, 20))).seq_id;
  const SeqId s2 = Insert(Concat(system, Range(300, 17))).seq_id;
  const ChunkContext& ctx = forest_->Context();
  ASSERT_TRUE(ValidateChunkContext(ctx, forest_->capacity()).ok()) << ValidateChunkContext(ctx, 64);
  ASSERT_EQ(ctx.num_seqs(), 3);
  ASSERT_EQ(ctx.num_shared(), 2);
  const auto shared = Chunks(s0);
  EXPECT_EQ(ctx.shared_chunk, (std::vector<int32_t>{shared[0], shared[1]}));
  EXPECT_EQ(ctx.shared_begin, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(ctx.shared_end, (std::vector<int32_t>{3, 3}));
  for (SeqId s : {s0, s1, s2}) {
    const int idx = forest_->ContextIndex(s);
    ASSERT_GE(idx, 0);
    EXPECT_EQ(ctx.seq_ids[idx], s);
    EXPECT_EQ(SequenceChunks(ctx, idx), Chunks(s));
    EXPECT_EQ(ctx.seq_len[idx], *forest_->Length(s));
  }
  EXPECT_EQ(forest_->ContextIndex(999), -1);
}

TEST_F(PrefixForestTest, ContextVersionChangesOnlyWithStructure) {
  const SeqId a = Insert(Range(0, 20)).seq_id;
  const SeqId b = Insert(Concat(Range(0, 16), {9, 9})).seq_id;
  const uint64_t v0 = forest_->Context().version;
  // Appending inside existing private chunks: same version, updated lengths.
  Append(a, {1});
  Append(b, {2, 3});
  const ChunkContext& ctx = forest_->Context();
  EXPECT_EQ(ctx.version, v0);
  EXPECT_EQ(ctx.seq_len[forest_->ContextIndex(a)], 21);
  EXPECT_EQ(ctx.seq_len[forest_->ContextIndex(b)], 20);
  EXPECT_TRUE(ValidateChunkContext(ctx, 64).ok()) << ValidateChunkContext(ctx, 64);
  // A chunk filling up: new version, still valid, grown in place.
  Append(a, Range(0, 12));
  const uint64_t v1 = forest_->Context().version;
  EXPECT_GT(v1, v0);
  EXPECT_TRUE(ValidateChunkContext(forest_->Context(), 64).ok());
  EXPECT_EQ(SequenceChunks(forest_->Context(), forest_->ContextIndex(a)), Chunks(a));
  // Many chunk-full events relocate the private range; still consistent.
  for (int i = 0; i < 10; ++i) Append(a, Range(0, 16));
  EXPECT_EQ(SequenceChunks(forest_->Context(), forest_->ContextIndex(a)), Chunks(a));
  EXPECT_TRUE(ValidateChunkContext(forest_->Context(), 64).ok());
  // Join and leave change the structure.
  const uint64_t v2 = forest_->Context().version;
  ASSERT_TRUE(forest_->Remove(b).ok());
  EXPECT_GT(forest_->Context().version, v2);
  EXPECT_EQ(forest_->Context().num_seqs(), 1);
  EXPECT_EQ(forest_->Context().num_shared(), 0);
}

}  // namespace
}  // namespace chunkattn
