// The CUDA model against its oracle, the CPU model, on the same weights
// (rounded to the GPU's 16-bit dtype first, so only activation rounding
// differs): chunked prefill over a matched prefix, TPP and sequence decode
// of sequences sharing prefixes, mixed steps, copy-on-write, CUDA graph
// replay against eager steps, device greedy picks, Qwen3's q/k norms (dummy
// weights and the NumPy reference's Qwen3), tensor parallelism over
// NCCL when two GPUs are visible, and bad inputs. Every test skips without
// a GPU.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "workers/collectives/nccl_communicator.h"
#include "workers/model/context_builder.h"
#include "workers/model/cuda_llama.h"
#include "workers/model/llama.h"
#include "workers/sampler/token_mask_testing.h"
#include "workers/tests/model_test_util.h"

namespace chunkattn {
namespace {

constexpr int kChunk = 16;

#define SKIP_WITHOUT_GPU()                                                   \
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible"

// `qwen3`: q/k norms, and a head_dim apart from hidden / heads.
ModelConfig SmallConfig(int head_dim, bool bias, bool tied, bool qwen3 = false) {
  ModelConfig c;
  c.architecture = qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  c.model_type = qwen3 ? "qwen3" : "llama";
  c.qk_norm = qwen3;
  c.vocab_size = 512;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = head_dim;
  c.hidden_size = qwen3 ? c.num_heads * head_dim / 2 : c.num_heads * head_dim;
  c.intermediate_size = 2 * c.hidden_size + 64;
  c.num_layers = 2;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.max_context = 1024;
  c.attention_bias = bias;
  c.tie_word_embeddings = tied;
  if (tied) {  // also cover llama3 rope scaling
    c.rope_scaling.kind = RopeScalingKind::kLlama3;
    c.rope_scaling.factor = 8;
    c.rope_scaling.original_max_position_embeddings = 256;
  }
  return c;
}

float Round(float x, DType t) {
  return t == DType::kBFloat16 ? BFloat16ToFloat(FloatToBFloat16(x)) : HalfToFloat(FloatToHalf(x));
}

// The weights the GPU sees, as fp32: matrices rounded to `t` (norms and
// biases stay fp32 on the GPU too).
void RoundMatrices(ModelWeights& w, DType t) {
  auto round = [t](WeightMatrix& m) {
    for (float& x : m.f32) x = Round(x, t);
  };
  round(w.embed);
  round(w.lm_head);
  for (LayerWeights& l : w.layers) {
    round(l.qkv);
    round(l.o);
    round(l.gate_up);
    round(l.down);
  }
}

struct Pair {
  std::unique_ptr<LlamaModel> cpu;
  std::unique_ptr<CudaLlamaModel> gpu;
};

// `weights` (whole-model, fp32) when given, else dummy weights of `seed`
// (with q/k norms away from the dummy ones, so that they matter).
Pair MakePair(const ModelConfig& config, DType t, DecodeImpl impl, bool graphs, int64_t max_rows = 512,
              uint64_t seed = 7, const ModelWeights* weights = nullptr) {
  absl::StatusOr<ModelWeights> w = weights != nullptr ? *weights : DummyWeights(config, {}, seed);
  EXPECT_TRUE(w.ok()) << w.status();
  if (weights == nullptr) {
    for (LayerWeights& l : w->layers) {
      for (size_t i = 0; i < l.q_norm.size(); ++i) l.q_norm[i] = 0.5f + 0.15f * static_cast<float>(i % 7);
      for (size_t i = 0; i < l.k_norm.size(); ++i) l.k_norm[i] = 1.5f - 0.2f * static_cast<float>(i % 5);
    }
  }
  RoundMatrices(*w, t);
  ModelOptions o;
  o.chunk_size = kChunk;
  o.num_kv_chunks = 256;
  o.decode_impl = impl;
  Pair p;
  ModelOptions co = o;
  co.kv_dtype = DType::kFloat32;
  auto cpu_model = LlamaModel::Create(config, *w, co, nullptr, nullptr);
  EXPECT_TRUE(cpu_model.ok()) << cpu_model.status();
  if (cpu_model.ok()) p.cpu = std::move(*cpu_model);
  o.kv_dtype = t;
  CudaModelOptions cuda;
  cuda.max_rows = max_rows;
  cuda.max_graph_batch = 64;
  cuda.cuda_graphs = graphs;
  auto gpu_model = CudaLlamaModel::Create(config, std::move(*w), o, cuda, nullptr);
  EXPECT_TRUE(gpu_model.ok()) << gpu_model.status();
  if (gpu_model.ok()) p.gpu = std::move(*gpu_model);
  return p;
}

// testing::RelError over whole vectors; a non-finite GPU value is an
// infinite error (std::max would skip a NaN).
double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  for (float x : a) {
    if (!std::isfinite(x)) return INFINITY;
  }
  return testing::RelError(a.data(), b.data(), std::min(a.size(), b.size()));
}

// Relative logits error allowed against the fp32 CPU model with the same
// (rounded) weights: the activations' rounding through two layers.
double Tolerance(DType t) { return t == DType::kBFloat16 ? 6e-2 : 1e-2; }

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = d(rng);
  return t;
}

using testing::Argmax;
using testing::OnePrefill;

// A small serving scenario driven by hand: `n` sequences, prompts sharing a
// prefix of `shared` tokens, prefilled (the first in full, the others over
// the matched prefix), then `steps` decode steps with the CPU's greedy
// tokens fed to both models. Checks every step's logits.
void RunScenario(const ModelConfig& config, DType t, DecodeImpl impl, bool graphs, int n, int shared,
                 int steps, const ModelWeights* weights = nullptr) {
  Pair m = MakePair(config, t, impl, graphs, 512, 7, weights);
  ASSERT_TRUE(m.cpu && m.gpu);
  const int vocab = config.vocab_size;
  std::mt19937 rng(11);
  const std::vector<int32_t> prefix = RandomTokens(rng, shared, vocab);
  std::vector<std::vector<int32_t>> seqs(n);
  std::vector<std::vector<int32_t>> chunks(n);
  int32_t next_chunk = 0;
  const int shared_chunks = shared / kChunk;
  std::vector<int32_t> prefix_chunks;
  for (int c = 0; c < shared_chunks; ++c) prefix_chunks.push_back(next_chunk++);
  for (int s = 0; s < n; ++s) {
    seqs[s] = prefix;
    const std::vector<int32_t> own = RandomTokens(rng, 5 + 7 * s % 23, vocab);
    seqs[s].insert(seqs[s].end(), own.begin(), own.end());
    chunks[s] = prefix_chunks;
    while (static_cast<int>(chunks[s].size()) * kChunk < static_cast<int>(seqs[s].size())) {
      chunks[s].push_back(next_chunk++);
    }
  }
  // Prefill: sequence 0 in full (it computes the shared prefix), the others
  // from the matched prefix on, all in one step.
  ForwardBatch pre;
  pre.prefill.q_begin = {0};
  pre.prefill.chunk_begin = {0};
  for (int s = 0; s < n; ++s) {
    const int from = s == 0 ? 0 : shared_chunks * kChunk;
    if (s == 1) {
      // Sequence 0 must be in the pool before the others read its prefix.
      std::vector<float> cpu_logits, gpu_logits;
      ASSERT_TRUE(m.cpu->Forward(pre, cpu_logits).ok());
      absl::Status st = m.gpu->Forward(pre, gpu_logits);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_LT(RelError(gpu_logits, cpu_logits), Tolerance(t)) << "prefill of sequence 0";
      pre = ForwardBatch();
      pre.prefill.q_begin = {0};
      pre.prefill.chunk_begin = {0};
    }
    pre.tokens.insert(pre.tokens.end(), seqs[s].begin() + from, seqs[s].end());
    pre.prefill.prefix_len.push_back(from);
    pre.prefill.q_begin.push_back(static_cast<int32_t>(pre.tokens.size()));
    pre.prefill.chunk_ids.insert(pre.prefill.chunk_ids.end(), chunks[s].begin(), chunks[s].end());
    pre.prefill.chunk_begin.push_back(static_cast<int32_t>(pre.prefill.chunk_ids.size()));
    pre.logits_rows.push_back(static_cast<int32_t>(pre.tokens.size()) - 1);
  }
  std::vector<float> cpu_logits, gpu_logits;
  ASSERT_TRUE(m.cpu->Forward(pre, cpu_logits).ok());
  absl::Status st = m.gpu->Forward(pre, gpu_logits);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_LT(RelError(gpu_logits, cpu_logits), Tolerance(t)) << "prefill over the matched prefix";
  // The first tokens: sequence 0's came with its own prefill.
  for (int s = 1; s < n; ++s) seqs[s].push_back(Argmax(cpu_logits.data() + (s - 1) * vocab, vocab));
  seqs[0].push_back(RandomTokens(rng, 1, vocab)[0]);

  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> lens(n);
    for (int s = 0; s < n; ++s) {
      lens[s] = static_cast<int32_t>(seqs[s].size());
      if (static_cast<int>(chunks[s].size()) * kChunk < lens[s]) chunks[s].push_back(next_chunk++);
    }
    absl::StatusOr<ChunkContext> ctx = BuildChunkContext(chunks, lens, kChunk, next_chunk);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ForwardBatch b;
    b.decode = &*ctx;
    for (int s = 0; s < n; ++s) {
      b.tokens.push_back(seqs[s].back());
      b.logits_rows.push_back(s);
    }
    ASSERT_TRUE(m.cpu->Forward(b, cpu_logits).ok());
    st = m.gpu->Forward(b, gpu_logits);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_LT(RelError(gpu_logits, cpu_logits), Tolerance(t)) << "decode step " << step;
    // The same step again through the device greedy path (its KV writes are
    // the same values to the same slots): picks are the argmax of the GPU's
    // own logits, logprobs their log-softmax.
    std::vector<int32_t> picks;
    std::vector<float> logprobs;
    st = m.gpu->ForwardGreedy(b, picks, logprobs);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(picks.size(), static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) {
      const float* row = gpu_logits.data() + s * vocab;
      EXPECT_EQ(picks[s], Argmax(row, vocab)) << "step " << step << " row " << s;
      double sum = 0;
      const float mx = *std::max_element(row, row + vocab);
      for (int i = 0; i < vocab; ++i) sum += std::exp(double{row[i]} - mx);
      EXPECT_NEAR(logprobs[s], row[picks[s]] - mx - std::log(sum), 1e-3);
    }
    // And through the device's full sampler: two samples per row (as n = 2
    // gives), temperature / top-k / top-p / min-p / penalty over the
    // sequence so far, against the host Sampler on the GPU's own logits
    // (the step recomputes them bit for bit: same graph or kernels, same KV).
    std::vector<SamplingParams> params(2 * n);
    std::vector<int32_t> rows(2 * n);
    std::vector<SampleInput> inputs(2 * n);
    std::vector<std::vector<uint32_t>> masks(2 * n);  // structured outputs: every third sample
    for (int k = 0; k < 2 * n; ++k) {
      SamplingParams& p = params[k];
      p.temperature = k % 3 == 0 ? 0.0f : 0.8f;
      p.top_k = k % 4 == 1 ? 20 : 0;
      p.top_p = k % 5 == 2 ? 0.9f : 1.0f;
      p.min_p = k % 7 == 3 ? 0.05f : 0.0f;
      p.repetition_penalty = k % 2 == 1 ? 1.3f : 1.0f;
      p.seed = 1000 + k;
      p.top_logprobs = k % 3 == 1 ? 5 : k % 3 == 2 ? kMaxTopLogprobs : 0;  // the host fallback
      rows[k] = k / 2;
      inputs[k].params = &p;
      inputs[k].history = seqs[k / 2];
      inputs[k].step = step;
      if (k % 3 == 2) masks[k] = sampler_testing::RandomTokenMask(vocab, rng);
      inputs[k].allowed = masks[k];
    }
    std::vector<SampleResult> sampled;
    st = m.gpu->ForwardSample(b, rows, inputs, sampled);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(sampled.size(), inputs.size());
    // The same step with the masks asked for after the layers are launched
    // (a GPU worker's overlap, Model::LateMasks): the same picks.
    std::vector<SampleInput> unmasked = inputs;
    for (SampleInput& in : unmasked) in.allowed = {};
    int late_calls = 0;
    const Model::LateMasks late = [&]() -> absl::StatusOr<absl::Span<const std::vector<uint32_t>>> {
      ++late_calls;
      return absl::MakeConstSpan(masks);
    };
    std::vector<SampleResult> sampled_late;
    st = m.gpu->ForwardSample(b, rows, unmasked, sampled_late, &late);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(late_calls, 1);
    ASSERT_EQ(sampled_late.size(), sampled.size());
    for (size_t k = 0; k < sampled.size(); ++k) {
      EXPECT_EQ(sampled_late[k].token, sampled[k].token) << "step " << step << " sample " << k;
      EXPECT_EQ(sampled_late[k].logprob, sampled[k].logprob) << "step " << step << " sample " << k;
      ASSERT_EQ(sampled_late[k].top.size, sampled[k].top.size) << "step " << step << " sample " << k;
      for (int j = 0; j < sampled[k].top.size; ++j) EXPECT_EQ(sampled_late[k].top.ids[j], sampled[k].top.ids[j]);
    }
    Sampler sampler;
    for (int k = 0; k < 2 * n; ++k) {
      SampleResult want;
      ASSERT_TRUE(sampler
                      .Sample(absl::MakeConstSpan(gpu_logits.data() + rows[k] * vocab, vocab), vocab,
                              {&inputs[k], 1}, absl::MakeSpan(&want, 1))
                      .ok());
      EXPECT_EQ(sampled[k].token, want.token) << "step " << step << " sample " << k;
      EXPECT_NEAR(sampled[k].logprob, want.logprob, 1e-4) << "step " << step << " sample " << k;
      // The top entries are the Sampler's on the same logits row.
      ASSERT_EQ(sampled[k].top.size, want.top.size) << "step " << step << " sample " << k;
      for (int j = 0; j < want.top.size; ++j) {
        EXPECT_EQ(sampled[k].top.ids[j], want.top.ids[j]) << "step " << step << " sample " << k << " entry " << j;
        EXPECT_NEAR(sampled[k].top.logprobs[j], want.top.logprobs[j], 1e-6) << "step " << step << " sample " << k;
        if (sampled[k].top.ids[j] == sampled[k].token) {
          EXPECT_EQ(sampled[k].top.logprobs[j], sampled[k].logprob) << "step " << step << " sample " << k;
        }
      }
    }
    for (int s = 0; s < n; ++s) seqs[s].push_back(Argmax(cpu_logits.data() + s * vocab, vocab));
  }
  if (graphs) {
    EXPECT_GT(m.gpu->num_graphs(), 0);
  } else {
    EXPECT_EQ(m.gpu->num_graphs(), 0);
  }
}

struct Variant {
  int head_dim;
  DType dtype;
  DecodeImpl impl;
  bool graphs;
  bool bias;
  bool tied;
  bool qwen3 = false;
};

class CudaModelTest : public ::testing::TestWithParam<Variant> {};

TEST_P(CudaModelTest, ServingScenarioMatchesCpuModel) {
  SKIP_WITHOUT_GPU();
  const Variant& v = GetParam();
  RunScenario(SmallConfig(v.head_dim, v.bias, v.tied, v.qwen3), v.dtype, v.impl, v.graphs, /*n=*/12, /*shared=*/48,
              /*steps=*/20);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaModelTest,
    ::testing::Values(Variant{64, DType::kFloat16, DecodeImpl::kTpp, true, false, false},
                      Variant{64, DType::kFloat16, DecodeImpl::kTpp, false, false, false},
                      Variant{64, DType::kFloat16, DecodeImpl::kSequence, true, false, false},
                      Variant{128, DType::kFloat16, DecodeImpl::kTpp, true, true, false},
                      Variant{64, DType::kBFloat16, DecodeImpl::kTpp, true, false, true},
                      Variant{128, DType::kBFloat16, DecodeImpl::kSequence, false, true, true},
                      // Qwen3: q/k norms (after the bias in the second).
                      Variant{64, DType::kBFloat16, DecodeImpl::kTpp, true, false, false, true},
                      Variant{128, DType::kFloat16, DecodeImpl::kSequence, true, true, false, true}),
    [](const ::testing::TestParamInfo<Variant>& info) {
      const Variant& v = info.param;
      return absl::StrFormat("%s_d%d_%s_%s%s%s", v.dtype == DType::kBFloat16 ? "bf16" : "fp16", v.head_dim,
                             v.impl == DecodeImpl::kTpp ? "tpp" : "seq", v.graphs ? "graphs" : "eager",
                             v.bias ? "_bias" : "", v.tied ? "_tied_llama3rope" : "") +
             (v.qwen3 ? "_qwen3" : "");
    });

// The NumPy reference's tiny Qwen3 (head_dim 64 over hidden 64, q/k norms far
// from ones), loaded from its Hugging Face files, against the CPU model that
// model_test checks against the reference's float64 logits.
TEST(CudaModelBasics, Qwen3ReferenceModelMatchesCpuModel) {
  SKIP_WITHOUT_GPU();
  const testing::Reference* ref = nullptr;
  for (const auto& r : testing::References()) {
    if (r.name == "numpy/qwen3_qk_norm") ref = &r;
  }
  ASSERT_NE(ref, nullptr);
  absl::StatusOr<ModelConfig> config = LoadModelConfig(ref->dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->qk_norm);
  absl::StatusOr<ModelWeights> weights = LoadWeights(ref->dir, *config, {});
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    RunScenario(*config, t, DecodeImpl::kTpp, true, /*n=*/4, /*shared=*/32, /*steps=*/8, &*weights);
  }
}

TEST(CudaModelBasics, GraphsAndEagerAgree) {
  SKIP_WITHOUT_GPU();
  const ModelConfig config = SmallConfig(64, false, false);
  Pair graph = MakePair(config, DType::kFloat16, DecodeImpl::kTpp, true);
  Pair eager = MakePair(config, DType::kFloat16, DecodeImpl::kTpp, false);
  ASSERT_TRUE(graph.gpu && eager.gpu);
  // Batches of 1..20 decode rows (buckets 1, 2, 4, 8, 16, 32) over fresh
  // one-chunk prompts.
  std::mt19937 rng(3);
  int32_t next_chunk = 0;
  for (int n : {1, 2, 3, 5, 8, 13, 20}) {
    std::vector<std::vector<int32_t>> chunks(n);
    std::vector<int32_t> lens(n, 1);
    ForwardBatch b;
    for (int s = 0; s < n; ++s) {
      chunks[s] = {next_chunk++};
      b.tokens.push_back(RandomTokens(rng, 1, config.vocab_size)[0]);
      b.logits_rows.push_back(s);
    }
    absl::StatusOr<ChunkContext> ctx = BuildChunkContext(chunks, lens, kChunk, next_chunk);
    ASSERT_TRUE(ctx.ok());
    b.decode = &*ctx;
    std::vector<float> a, e, again;
    ASSERT_TRUE(graph.gpu->Forward(b, a).ok());  // the bucket's eager warm-up
    ASSERT_TRUE(eager.gpu->Forward(b, e).ok());
    // Different GEMM shapes (padded bucket rows) may sum in another order.
    EXPECT_LT(RelError(a, e), 2e-3) << n << " rows";
    // The same step again (same KV to the same slots) captures and replays.
    // Not bit-equal: cuBLAS may choose another GEMM algorithm (split-K, its
    // workspace) under stream capture than in the eager warm-up, and fp16
    // sums in another order differ in the last bits. A replay that read a
    // stale plan or wrong buffers is off by far more.
    ASSERT_TRUE(graph.gpu->Forward(b, again).ok());
    EXPECT_LT(RelError(again, a), 1e-3) << n << " rows: the replay differs from the eager run of the same bucket";
  }
  EXPECT_EQ(graph.gpu->num_graphs(), 6);
}

TEST(CudaModelBasics, MixedStepAndCopyOnWrite) {
  SKIP_WITHOUT_GPU();
  const ModelConfig config = SmallConfig(64, true, false);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    Pair m = MakePair(config, t, DecodeImpl::kTpp, true);
    ASSERT_TRUE(m.cpu && m.gpu);
    std::mt19937 rng(5);
    // Sequence A: 20 tokens in chunks 0, 1. Prefill it.
    const std::vector<int32_t> a = RandomTokens(rng, 20, config.vocab_size);
    ForwardBatch pa = OnePrefill(a, 0, {0, 1});
    pa.logits_rows = {19};
    std::vector<float> lc, lg;
    ASSERT_TRUE(m.cpu->Forward(pa, lc).ok());
    ASSERT_TRUE(m.gpu->Forward(pa, lg).ok());
    EXPECT_LT(RelError(lg, lc), Tolerance(t));
    // One step: B forks A's partial chunk 1 by copy-on-write into chunk 2 and
    // prefills 6 tokens after A's 20; A decodes one token in chunk 1.
    const std::vector<int32_t> b_new = RandomTokens(rng, 6, config.vocab_size);
    absl::StatusOr<ChunkContext> ctx = BuildChunkContext({{0, 1}}, {21}, kChunk, 3);
    ASSERT_TRUE(ctx.ok());
    ForwardBatch mixed;
    mixed.copies = {{1, 2, 4}};
    mixed.tokens = b_new;
    mixed.tokens.push_back(7);
    mixed.prefill.prefix_len = {20};
    mixed.prefill.q_begin = {0, 6};
    mixed.prefill.chunk_begin = {0, 2};
    mixed.prefill.chunk_ids = {0, 2};
    mixed.decode = &*ctx;
    mixed.logits_rows = {6, 5, 0};
    ASSERT_TRUE(m.cpu->Forward(mixed, lc).ok());
    absl::Status st = m.gpu->Forward(mixed, lg);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_LT(RelError(lg, lc), Tolerance(t)) << DTypeName(t);
  }
}

TEST(CudaModelBasics, RefusesBadInputs) {
  SKIP_WITHOUT_GPU();
  const ModelConfig config = SmallConfig(64, false, false);
  absl::StatusOr<ModelWeights> w = DummyWeights(config, {}, 1);
  ASSERT_TRUE(w.ok());
  ModelOptions o;
  o.chunk_size = kChunk;
  o.kv_dtype = DType::kFloat32;
  CudaModelOptions cuda;
  cuda.max_rows = 8;
  EXPECT_EQ(CudaLlamaModel::Create(config, *w, o, cuda, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelConfig odd = SmallConfig(32, false, false);
  absl::StatusOr<ModelWeights> wo = DummyWeights(odd, {}, 1);
  ASSERT_TRUE(wo.ok());
  o.kv_dtype = DType::kFloat16;
  EXPECT_EQ(CudaLlamaModel::Create(odd, *wo, o, cuda, nullptr).status().code(), absl::StatusCode::kUnimplemented);

  auto model = CudaLlamaModel::Create(config, *w, o, cuda, nullptr);
  ASSERT_TRUE(model.ok()) << model.status();
  ForwardBatch b = OnePrefill({1, 2}, 0, {0});
  b.logits_rows = {1};
  std::vector<float> logits;
  EXPECT_EQ((*model)->Forward(b, logits).code(), absl::StatusCode::kFailedPrecondition);  // no pool yet
  absl::StatusOr<int64_t> capacity = (*model)->KvCapacity(0.9);
  ASSERT_TRUE(capacity.ok());
  EXPECT_GT(*capacity, 16);
  EXPECT_EQ((*model)->KvCapacity(1.5).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*model)->AllocateKvPool(16).ok());
  EXPECT_EQ((*model)->AllocateKvPool(16).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*model)->Forward(b, logits).ok());

  ForwardBatch bad = b;
  bad.tokens[0] = config.vocab_size;
  EXPECT_EQ((*model)->Forward(bad, logits).code(), absl::StatusCode::kInvalidArgument);
  bad = b;
  bad.prefill.chunk_ids = {16};  // outside the pool
  EXPECT_EQ((*model)->Forward(bad, logits).code(), absl::StatusCode::kInvalidArgument);
  bad = b;
  bad.copies = {{0, 99, 4}};
  EXPECT_EQ((*model)->Forward(bad, logits).code(), absl::StatusCode::kInvalidArgument);
  // More rows than the workspace holds.
  ForwardBatch big = OnePrefill(std::vector<int32_t>(9, 1), 0, {1});
  big.logits_rows.clear();
  EXPECT_EQ((*model)->Forward(big, logits).code(), absl::StatusCode::kInvalidArgument);
  // Samples the Sampler would refuse, refused before the step runs.
  SamplingParams hot;
  hot.temperature = 1;
  hot.repetition_penalty = 1.2f;
  const std::vector<int32_t> bad_history = {config.vocab_size};
  SampleInput in;
  in.params = &hot;
  std::vector<SampleResult> sampled;
  EXPECT_EQ((*model)->ForwardSample(b, {1}, {in}, sampled).code(), absl::StatusCode::kInvalidArgument)
      << "row 1 of one logits row";
  in.history = bad_history;
  EXPECT_EQ((*model)->ForwardSample(b, {0}, {in}, sampled).code(), absl::StatusCode::kInvalidArgument)
      << "history token outside the vocabulary";
  in.history = {};
  EXPECT_TRUE((*model)->ForwardSample(b, {0}, {in}, sampled).ok());
  ASSERT_EQ(sampled.size(), 1u);
  EXPECT_GE(sampled[0].token, 0);
  // Late masks (Model::LateMasks) that fail, miscount or overflow the
  // vocabulary end the step with their error after the launched work.
  const Model::LateMasks failing = []() -> absl::StatusOr<absl::Span<const std::vector<uint32_t>>> {
    return absl::UnavailableError("the coordinator's stream closed");
  };
  EXPECT_EQ((*model)->ForwardSample(b, {0}, {in}, sampled, &failing).code(), absl::StatusCode::kUnavailable);
  const std::vector<std::vector<uint32_t>> two(2), wide(1, std::vector<uint32_t>((config.vocab_size + 31) / 32 + 1, 1));
  const Model::LateMasks miscounted = [&]() -> absl::StatusOr<absl::Span<const std::vector<uint32_t>>> {
    return absl::MakeConstSpan(two);
  };
  EXPECT_EQ((*model)->ForwardSample(b, {0}, {in}, sampled, &miscounted).code(), absl::StatusCode::kInvalidArgument);
  const Model::LateMasks too_wide = [&]() -> absl::StatusOr<absl::Span<const std::vector<uint32_t>>> {
    return absl::MakeConstSpan(wide);
  };
  EXPECT_EQ((*model)->ForwardSample(b, {0}, {in}, sampled, &too_wide).code(), absl::StatusCode::kInvalidArgument);
  // Still usable after the refusals.
  EXPECT_TRUE((*model)->Forward(b, logits).ok());
}

TEST(CudaModelBasics, TensorParallelOverNcclMatchesOneRank) {
  SKIP_WITHOUT_GPU();
  if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs";
  const ModelConfig config = SmallConfig(64, false, false);
  const DType t = DType::kFloat16;
  Pair whole = MakePair(config, t, DecodeImpl::kTpp, true);
  ASSERT_TRUE(whole.gpu);
  absl::StatusOr<std::string> id = NcclCommunicator::MakeUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::mt19937 rng(9);
  const std::vector<int32_t> prompt = RandomTokens(rng, 40, config.vocab_size);
  ForwardBatch b = OnePrefill(prompt, 0, {0, 1, 2});
  b.logits_rows = {39};
  std::vector<float> expected;
  ASSERT_TRUE(whole.gpu->Forward(b, expected).ok());
  std::vector<std::vector<float>> got(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = NcclCommunicator::Create(r, 2, *id, r, absl::Seconds(60));
      if (!comm.ok()) {
        status[r] = comm.status();
        return;
      }
      absl::StatusOr<ModelWeights> w = DummyWeights(config, {r, 2}, 7);
      RoundMatrices(*w, t);
      ModelOptions o;
      o.chunk_size = kChunk;
      o.num_kv_chunks = 256;
      o.kv_dtype = t;
      CudaModelOptions cuda;
      cuda.device = r;
      auto model = CudaLlamaModel::Create(config, std::move(*w), o, cuda, comm->get());
      if (!model.ok()) {
        status[r] = model.status();
        return;
      }
      status[r] = (*model)->Forward(b, got[r]);
    });
  }
  for (auto& th : ranks) th.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_LT(RelError(got[r], expected), 1e-2) << "rank " << r;
  }
  EXPECT_EQ(got[0], got[1]);  // all-reduce leaves every rank the same values
}

}  // namespace
}  // namespace chunkattn
