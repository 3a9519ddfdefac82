// The model against reference logits, and the serving paths that must not
// change them: TPP decode, chunked prefill, prefix reuse, mixed steps, TP.
#include <thread>

#include "gtest/gtest.h"
#include "workers/collectives/in_process_group.h"
#include "workers/tests/model_test_util.h"

namespace chunkattn {
namespace {

using testing::Argmax;
using testing::Chunks;
using testing::LoadModelOrDie;
using testing::PrefillPiece;
using testing::References;
using testing::RelError;

constexpr int kChunk = 16;
constexpr double kTolerance = 1e-4;  // relative, fp32 against the reference

ModelOptions Options(DecodeImpl impl = DecodeImpl::kTpp) {
  ModelOptions o;
  o.chunk_size = kChunk;
  o.num_kv_chunks = 64;
  o.decode_impl = impl;
  return o;
}

int NumChunks(int tokens) { return (tokens + kChunk - 1) / kChunk; }

// Decodes `steps` tokens for one sequence whose prompt is in `chunks`;
// returns each step's logits and appends the greedy tokens to `seq`.
std::vector<std::vector<float>> GreedyDecode(LlamaModel& model, std::vector<int32_t>& seq,
                                             std::vector<int32_t> chunks, int steps,
                                             int32_t next_free_chunk) {
  const int vocab = model.config().vocab_size;
  std::vector<std::vector<float>> out;
  for (int step = 0; step < steps; ++step) {
    const int len = static_cast<int>(seq.size());
    if (NumChunks(len) > static_cast<int>(chunks.size())) chunks.push_back(next_free_chunk++);
    auto ctx = BuildChunkContext({chunks}, {len}, kChunk, chunks.size());
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    ForwardBatch b;
    b.tokens = {seq.back()};
    b.decode = &*ctx;
    b.logits_rows = {0};
    std::vector<float> logits;
    EXPECT_TRUE(model.Forward(b, logits).ok());
    seq.push_back(Argmax(logits.data(), vocab));
    out.push_back(std::move(logits));
  }
  return out;
}

TEST(ModelReferenceTest, FixturesExist) { ASSERT_GE(References().size(), 4u); }

TEST(ModelReferenceTest, PrefillLogitsMatchReference) {
  for (const auto& ref : References()) {
    auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options());
    for (size_t p = 0; p < ref.prompts.size(); ++p) {
      const auto& prompt = ref.prompts[p];
      auto logits = PrefillPiece(*model, prompt, 0, Chunks(0, NumChunks(prompt.size())));
      ASSERT_EQ(logits.size(), ref.logits[p].size());
      EXPECT_LT(RelError(logits.data(), ref.logits[p].data(), logits.size()), kTolerance)
          << ref.name << " prompt " << p;
    }
  }
}

TEST(ModelReferenceTest, GreedyDecodeMatchesReference) {
  for (const auto& ref : References()) {
    for (auto impl : {DecodeImpl::kTpp, DecodeImpl::kSequence}) {
      auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options(impl));
      const int vocab = model->config().vocab_size;
      for (size_t p = 0; p < ref.prompts.size(); ++p) {
        std::vector<int32_t> seq = ref.prompts[p];
        const int n = NumChunks(seq.size());
        auto logits = PrefillPiece(*model, seq, 0, Chunks(0, n));
        seq.push_back(Argmax(logits.data() + (seq.size() - 1) * vocab, vocab));
        GreedyDecode(*model, seq, Chunks(0, n), ref.greedy[p].size() - 1, n);
        EXPECT_EQ(std::vector<int32_t>(seq.begin() + ref.prompts[p].size(), seq.end()),
                  ref.greedy[p])
            << ref.name << " prompt " << p << " " << DecodeImplName(impl);
      }
    }
  }
}

TEST(ModelReferenceTest, ChunkedPrefillMatchesReference) {
  for (const auto& ref : References()) {
    auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options());
    const int vocab = model->config().vocab_size;
    const auto& prompt = ref.prompts.back();
    const auto chunks = Chunks(0, NumChunks(prompt.size()));
    for (int piece : {1, 9, 16}) {
      for (size_t begin = 0; begin < prompt.size(); begin += piece) {
        const size_t end = std::min(prompt.size(), begin + piece);
        std::vector<int32_t> tokens(prompt.begin() + begin, prompt.begin() + end);
        auto logits = PrefillPiece(*model, tokens, begin, chunks);
        EXPECT_LT(RelError(logits.data(), ref.logits.back().data() + begin * vocab, logits.size()),
                  kTolerance)
            << ref.name << " piece " << piece << " at " << begin;
      }
    }
  }
}

// Sequences that share a cached prompt prefix (prefill skips it) and then
// decode together with two-phase partition attention give the logits of each
// sequence computed alone from scratch.
TEST(ModelServingTest, SharedPrefixPrefillAndBatchedDecodeMatchScratch) {
  for (const auto& ref : References()) {
    const auto& base = ref.prompts.back();  // 50 tokens
    const int vocab = 256, prefix = 2 * kChunk, steps = 6;
    std::vector<std::vector<int32_t>> prompts;
    for (int suffix : {5, 11, 16, 18}) {
      std::vector<int32_t> p(base.begin(), base.begin() + prefix);
      for (int i = 0; i < suffix; ++i) p.push_back((base[prefix + i % 18] + 7 * prompts.size() + i) % vocab);
      prompts.push_back(p);
    }
    // Alone, from scratch.
    std::vector<std::vector<std::vector<float>>> solo;
    for (const auto& prompt : prompts) {
      auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options());
      std::vector<int32_t> seq = prompt;
      const int n = NumChunks(seq.size());
      auto logits = PrefillPiece(*model, seq, 0, Chunks(0, n));
      std::vector<std::vector<float>> steps_logits = {
          std::vector<float>(logits.end() - vocab, logits.end())};
      seq.push_back(Argmax(steps_logits[0].data(), vocab));
      auto more = GreedyDecode(*model, seq, Chunks(0, n), steps - 1, n);
      steps_logits.insert(steps_logits.end(), more.begin(), more.end());
      solo.push_back(std::move(steps_logits));
    }
    for (auto impl : {DecodeImpl::kTpp, DecodeImpl::kSequence}) {
      auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options(impl));
      // Sequence 0 computes the prefix; the others find it cached and
      // prefill only their suffix. Chunks 0, 1 hold the shared prefix.
      int32_t next = 2;
      std::vector<std::vector<int32_t>> paths;
      std::vector<std::vector<int32_t>> seqs = prompts;
      for (size_t s = 0; s < prompts.size(); ++s) {
        std::vector<int32_t> path = {0, 1};
        while (static_cast<int>(path.size()) < NumChunks(prompts[s].size())) path.push_back(next++);
        const int skip = s == 0 ? 0 : prefix;
        std::vector<int32_t> tokens(prompts[s].begin() + skip, prompts[s].end());
        auto logits = PrefillPiece(*model, tokens, skip, path);
        EXPECT_LT(RelError(logits.data() + logits.size() - vocab, solo[s][0].data(), vocab),
                  kTolerance)
            << ref.name << " seq " << s;
        seqs[s].push_back(Argmax(logits.data() + logits.size() - vocab, vocab));
        paths.push_back(path);
      }
      for (int step = 1; step < steps; ++step) {
        std::vector<int32_t> lens;
        ForwardBatch b;
        for (size_t s = 0; s < seqs.size(); ++s) {
          lens.push_back(seqs[s].size());
          if (NumChunks(seqs[s].size()) > static_cast<int>(paths[s].size())) paths[s].push_back(next++);
          b.tokens.push_back(seqs[s].back());
          b.logits_rows.push_back(s);
        }
        auto ctx = BuildChunkContext(paths, lens, kChunk, next);
        ASSERT_TRUE(ctx.ok()) << ctx.status();
        ASSERT_EQ(ctx->num_shared(), 2);
        b.decode = &*ctx;
        std::vector<float> logits;
        ASSERT_TRUE(model->Forward(b, logits).ok());
        for (size_t s = 0; s < seqs.size(); ++s) {
          EXPECT_LT(RelError(logits.data() + s * vocab, solo[s][step].data(), vocab), kTolerance)
              << ref.name << " seq " << s << " step " << step << " " << DecodeImplName(impl);
          seqs[s].push_back(Argmax(logits.data() + s * vocab, vocab));
        }
      }
    }
  }
}

// A prompt that matches a cached prompt part way into a chunk: the matched
// slots are copied (copy-on-write) and only the rest is computed.
TEST(ModelServingTest, PartialChunkMatchWithKvCopy) {
  const auto& ref = References()[1];
  const auto& a = ref.prompts.back();  // 50 tokens in chunks 0..3
  std::vector<int32_t> b(a.begin(), a.begin() + 40);
  for (int i = 0; i < 12; ++i) b.push_back((a[i] + 3) % 256);
  auto scratch_model = LoadModelOrDie(ref.dir, {}, nullptr, Options());
  auto scratch = PrefillPiece(*scratch_model, b, 0, Chunks(0, NumChunks(b.size())));

  auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options());
  PrefillPiece(*model, a, 0, Chunks(0, 4));
  // b shares chunks 0, 1 and copies slots 0..7 of chunk 2 into its chunk 10.
  std::vector<int32_t> suffix(b.begin() + 40, b.end());
  auto logits = PrefillPiece(*model, suffix, 40, {0, 1, 10, 11}, {{2, 10, 8}});
  EXPECT_LT(RelError(logits.data(), scratch.data() + 40 * 256, logits.size()), kTolerance);
}

// One step holding a prefill piece and decode tokens gives what the two
// give in separate steps.
TEST(ModelServingTest, MixedPrefillAndDecodeStep) {
  const auto& ref = References()[0];
  const int vocab = 256;
  const auto& a = ref.prompts[2];  // 23 tokens, decoding
  const auto& b = ref.prompts[3];  // 50 tokens, prefilling
  auto separate = LoadModelOrDie(ref.dir, {}, nullptr, Options());
  PrefillPiece(*separate, a, 0, {0, 1});
  std::vector<int32_t> seq = a;
  seq.push_back(5);
  auto decode_alone = GreedyDecode(*separate, seq, {0, 1}, 1, 2)[0];
  auto prefill_alone = PrefillPiece(*separate, b, 0, Chunks(20, 4));

  auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options());
  PrefillPiece(*model, a, 0, {0, 1});
  ForwardBatch mixed;
  mixed.tokens = b;
  mixed.tokens.push_back(5);
  mixed.prefill.prefix_len = {0};
  mixed.prefill.q_begin = {0, 50};
  mixed.prefill.chunk_begin = {0, 4};
  mixed.prefill.chunk_ids = Chunks(20, 4);
  auto ctx = BuildChunkContext({{0, 1}}, {24}, kChunk, 1);
  ASSERT_TRUE(ctx.ok());
  mixed.decode = &*ctx;
  mixed.logits_rows = {49, 50};
  std::vector<float> logits;
  ASSERT_TRUE(model->Forward(mixed, logits).ok());
  EXPECT_LT(RelError(logits.data(), prefill_alone.data() + 49 * vocab, vocab), 1e-5);
  EXPECT_LT(RelError(logits.data() + vocab, decode_alone.data(), vocab), 1e-5);
}

// Tensor parallelism (in-process ranks on threads) gives the single-rank
// logits, for prefill and decode; TP=4 also replicates KV heads when the
// model has fewer than 4.
TEST(ModelServingTest, TensorParallelMatchesSingleRank) {
  for (const auto& ref : References()) {
    const auto& prompt = ref.prompts.back();
    const int n = NumChunks(prompt.size()), vocab = 256, steps = 4;
    auto single = LoadModelOrDie(ref.dir, {}, nullptr, Options());
    auto expect_prefill = PrefillPiece(*single, prompt, 0, Chunks(0, n));
    std::vector<int32_t> expect_seq = prompt;
    expect_seq.push_back(Argmax(expect_prefill.data() + expect_prefill.size() - vocab, vocab));
    auto expect_decode = GreedyDecode(*single, expect_seq, Chunks(0, n), steps, n);
    for (int world : {2, 4}) {
      auto group = MakeInProcessGroup(world);
      ASSERT_TRUE(group.ok());
      std::vector<std::thread> threads;
      for (int rank = 0; rank < world; ++rank) {
        threads.emplace_back([&, rank] {
          auto model = LoadModelOrDie(ref.dir, {rank, world}, (*group)[rank].get(), Options());
          if (model == nullptr) return;
          auto prefill = PrefillPiece(*model, prompt, 0, Chunks(0, n));
          EXPECT_LT(RelError(prefill.data(), expect_prefill.data(), prefill.size()), kTolerance)
              << ref.name << " TP " << world << " rank " << rank;
          std::vector<int32_t> seq = prompt;
          seq.push_back(Argmax(prefill.data() + prefill.size() - vocab, vocab));
          auto decode = GreedyDecode(*model, seq, Chunks(0, n), steps, n);
          EXPECT_EQ(seq, expect_seq) << ref.name << " TP " << world << " rank " << rank;
          for (int s = 0; s < steps; ++s) {
            EXPECT_LT(RelError(decode[s].data(), expect_decode[s].data(), vocab), kTolerance);
          }
        });
      }
      for (auto& t : threads) t.join();
    }
  }
}

}  // namespace
}  // namespace chunkattn

extern "C" int openblas_get_num_threads(void);

namespace chunkattn {
namespace {

// The model's GEMMs run on as many OpenBLAS threads as its pool has (not one
// per core of the machine).
TEST(ModelServingTest, BlasThreadsFollowThePool) {
  const auto& ref = References()[0];
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options(), &pool);
    ASSERT_TRUE(model);
    EXPECT_EQ(openblas_get_num_threads(), threads);
  }
  auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options());
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

TEST(ModelServingTest, RejectsMalformedBatches) {
  const auto& ref = References()[0];
  auto model = LoadModelOrDie(ref.dir, {}, nullptr, Options());
  auto expect_invalid = [&](const ForwardBatch& b, const char* why) {
    std::vector<float> logits;
    const absl::Status st = model->Forward(b, logits);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << why << ": " << st;
  };
  auto good = [] {
    ForwardBatch b;
    b.tokens = {3, 4, 5};
    b.prefill.prefix_len = {0};
    b.prefill.q_begin = {0, 3};
    b.prefill.chunk_begin = {0, 1};
    b.prefill.chunk_ids = {0};
    b.logits_rows = {2};
    return b;
  };
  std::vector<float> logits;
  ASSERT_TRUE(model->Forward(good(), logits).ok());
  auto b = good();
  b.tokens[1] = 256;
  expect_invalid(b, "token outside the vocabulary");
  b = good();
  b.tokens[1] = -1;
  expect_invalid(b, "negative token");
  b = good();
  b.tokens.push_back(1);
  expect_invalid(b, "more tokens than rows");
  b = good();
  b.prefill.chunk_ids = {64};
  expect_invalid(b, "chunk outside the pool");
  b = good();
  b.logits_rows = {3};
  expect_invalid(b, "logits row outside the batch");
  b = good();
  b.prefill.prefix_len = {255};
  b.prefill.chunk_begin = {0, 17};
  b.prefill.chunk_ids = Chunks(0, 17);
  expect_invalid(b, "position past the context");
  b = good();
  b.copies = {{0, 99, 4}};
  expect_invalid(b, "copy outside the pool");
  b = good();
  b.tokens.clear();
  b.prefill = {};
  expect_invalid(b, "empty batch");
  auto ctx = BuildChunkContext({{0}}, {3}, kChunk, 1);
  ctx->seq_len[0] = 40;  // does not end in its last chunk
  b = ForwardBatch();
  b.tokens = {1};
  b.decode = &*ctx;
  expect_invalid(b, "seq_len past its chunks");
}

}  // namespace
}  // namespace chunkattn
