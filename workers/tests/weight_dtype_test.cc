// The CPU model on 16-bit and weight-only int8 weights (--weight_dtype),
// against the fp32 model on the same checkpoint, on the tiny reference model
// of each family (Llama MHA, Llama 3 GQA, Qwen2 tied, Qwen3 q/k norm):
//  * a 16-bit checkpoint kept 16-bit gives the fp32 model's logits: the same
//    weight values, summed in the same order;
//  * weights rounded to 16 bits or quantized to int8 stay within a bound of
//    the fp32 logits, and greedy tokens agree wherever fp32's margin between
//    its best two tokens exceeds twice that bound.
// The measured differences are printed (docs/models.md quotes them).
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "gtest/gtest.h"
#include "kernels/cpu/int8_layout.h"
#include "workers/model/context_builder.h"
#include "workers/tests/model_test_util.h"

namespace chunkattn {
// Named, not anonymous: unity builds put this file beside model_test.cc.
namespace weight_dtype_test {

namespace fs = std::filesystem;
using testing::Argmax;
using testing::Chunks;
using testing::References;

constexpr int kChunk = 16;
constexpr int kSteps = 24;  // decode steps after each prompt

std::unique_ptr<LlamaModel> Load(const std::string& dir, WeightDType dtype) {
  auto config = LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  auto weights = LoadWeights(dir, *config, {}, dtype);
  EXPECT_TRUE(weights.ok()) << weights.status();
  ModelOptions options;
  options.chunk_size = kChunk;
  options.num_kv_chunks = 64;
  auto model = LlamaModel::Create(*config, std::move(*weights), options, nullptr, nullptr);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// Every logits row of one sequence: the prompt's prefill, then kSteps decode
// steps. Each step feeds forced[step] when `forced` is given (so two models
// see the same inputs), else the model's own greedy token.
struct Trace {
  std::vector<std::vector<float>> rows;  // prompt rows, then one per step
  std::vector<int32_t> greedy;           // argmax after the prompt and after each step
};

Trace RunTrace(LlamaModel& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>* forced) {
  const int vocab = model.config().vocab_size;
  Trace t;
  std::vector<int32_t> chunks = Chunks(0, static_cast<int>((prompt.size() + kChunk - 1) / kChunk));
  const std::vector<float> pre = testing::PrefillPiece(model, prompt, 0, chunks);
  for (size_t r = 0; r < prompt.size(); ++r) {
    t.rows.emplace_back(pre.begin() + r * vocab, pre.begin() + (r + 1) * vocab);
  }
  t.greedy.push_back(Argmax(t.rows.back().data(), vocab));
  int len = static_cast<int>(prompt.size());
  for (int step = 0; step < kSteps; ++step) {
    const int32_t token = forced != nullptr ? (*forced)[step] : t.greedy.back();
    ++len;
    if ((len + kChunk - 1) / kChunk > static_cast<int>(chunks.size())) {
      chunks.push_back(static_cast<int32_t>(chunks.size()));
    }
    auto ctx = BuildChunkContext({chunks}, {len}, kChunk, chunks.size());
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    ForwardBatch b;
    b.tokens = {token};
    b.decode = &*ctx;
    b.logits_rows = {0};
    std::vector<float> logits;
    const absl::Status st = model.Forward(b, logits);
    EXPECT_TRUE(st.ok()) << st;
    t.greedy.push_back(Argmax(logits.data(), vocab));
    t.rows.push_back(std::move(logits));
  }
  return t;
}

struct Diff {
  double max = 0, mean = 0, scale = 0;  // max and mean |a - b|, max |b|
};

Diff Compare(const Trace& a, const Trace& b) {
  Diff d;
  double sum = 0;
  int64_t n = 0;
  for (size_t r = 0; r < b.rows.size(); ++r) {
    for (size_t i = 0; i < b.rows[r].size(); ++i) {
      const double e = std::abs(double{a.rows[r][i]} - double{b.rows[r][i]});
      d.max = std::max(d.max, e);
      d.scale = std::max(d.scale, std::abs(double{b.rows[r][i]}));
      sum += e;
      ++n;
    }
  }
  d.mean = sum / std::max<int64_t>(n, 1);
  return d;
}

// Best minus second-best logit.
float Margin(const std::vector<float>& row) {
  float best = -INFINITY, second = -INFINITY;
  for (float x : row) {
    if (x > best) {
      second = best;
      best = x;
    } else if (x > second) {
      second = x;
    }
  }
  return best - second;
}

// A free-running greedy continuation agrees with fp32's for as long as every
// fp32 step's margin exceeds 2 * bound (beyond, a tie may flip it); returns
// how many tokens that covered, or -1 (and fails) on an earlier disagreement.
int GreedyAgreesWhereMarginAllows(const Trace& got, const Trace& fp32, double bound, const std::string& where) {
  const size_t prompt = fp32.rows.size() - kSteps;
  for (size_t s = 0; s < fp32.greedy.size(); ++s) {
    if (Margin(fp32.rows[prompt - 1 + s]) <= 2 * bound) return static_cast<int>(s);
    if (got.greedy[s] != fp32.greedy[s]) {
      ADD_FAILURE() << where << ": greedy token " << s << " is " << got.greedy[s] << ", fp32's " << fp32.greedy[s]
                    << " with margin " << Margin(fp32.rows[prompt - 1 + s]) << " over bound " << bound;
      return -1;
    }
  }
  return static_cast<int>(fp32.greedy.size());
}

TEST(WeightDTypeTest, ParsesNamesAndRejectsOthers) {
  const std::pair<const char*, WeightDType> good[] = {
      {"auto", WeightDType::kAuto},         {"float32", WeightDType::kFloat32},   {"fp32", WeightDType::kFloat32},
      {"float16", WeightDType::kFloat16},   {"fp16", WeightDType::kFloat16},      {"bfloat16", WeightDType::kBFloat16},
      {"bf16", WeightDType::kBFloat16},     {"int8", WeightDType::kInt8}};
  for (const auto& [name, dtype] : good) {
    auto parsed = ParseWeightDType(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_EQ(*parsed, dtype) << name;
  }
  for (const char* bad : {"", "int4", "INT8", "float64", "q8_0", "auto "}) {
    auto parsed = ParseWeightDType(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << '"' << bad << '"';
    EXPECT_NE(parsed.status().message().find("auto, float32, float16, bfloat16 or int8"), std::string::npos)
        << parsed.status();
  }
}

// Matrices are stored as asked (auto: as the checkpoint), at 4, 2 or about
// 1.0625 bytes a weight; norms stay fp32; dummy weights honour the dtype.
TEST(WeightDTypeTest, MatricesAreStoredInTheAskedDtype) {
  const auto& ref = References()[1];
  auto config = LoadModelConfig(ref.dir);
  ASSERT_TRUE(config.ok());
  auto f32 = LoadWeights(ref.dir, *config, {}, WeightDType::kAuto);  // an fp32 checkpoint
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ(f32->layers[0].gate_up.dtype, WeightDType::kFloat32);
  const int64_t hidden = config->hidden_size;
  for (WeightDType t : {WeightDType::kFloat16, WeightDType::kBFloat16, WeightDType::kInt8}) {
    auto w = LoadWeights(ref.dir, *config, {}, t);
    ASSERT_TRUE(w.ok()) << w.status();
    for (const WeightMatrix* m : {&w->embed, &w->lm_head, &w->layers[1].qkv, &w->layers[1].down}) {
      EXPECT_EQ(m->dtype, t);
      EXPECT_TRUE(m->f32.empty());
    }
    EXPECT_EQ(w->layers[0].input_norm, f32->layers[0].input_norm);
    const WeightMatrix& e = w->embed;
    if (t == WeightDType::kInt8) {
      EXPECT_EQ(e.block, kInt8Block);
      EXPECT_EQ(e.bytes(), e.num_elements() + e.num_elements() / kInt8Block * 2);
    } else {
      EXPECT_EQ(e.bytes(), 2 * e.num_elements());
    }
    // Every value within half a step of the fp32 one.
    const std::vector<float> got = e.ToFloat();
    for (int64_t i = 0; i < e.num_elements(); ++i) {
      const float want = f32->embed.f32[i];
      const double step = t == WeightDType::kInt8 ? HalfToFloat(e.scales[i / e.block])
                          : t == WeightDType::kFloat16 ? std::abs(want) * 0x1p-10 + 0x1p-24
                                                       : std::abs(want) * 0x1p-7;
      ASSERT_LE(std::abs(got[i] - want), step / 2 * 1.0001) << WeightDTypeName(t) << " at " << i;
    }
    auto dummy = DummyWeights(*config, {}, 7, t);
    ASSERT_TRUE(dummy.ok());
    EXPECT_EQ(dummy->layers[0].o.dtype, t);
    EXPECT_EQ(dummy->embed.rows, config->vocab_size);
    EXPECT_EQ(dummy->embed.cols, hidden);
  }
  auto rounded = DummyWeights(*config, {}, 7, WeightDType::kBFloat16);
  auto exact = DummyWeights(*config, {}, 7, WeightDType::kFloat32);
  ASSERT_TRUE(rounded.ok() && exact.ok());
  for (size_t i = 0; i < exact->layers[0].qkv.f32.size(); ++i) {
    ASSERT_EQ(rounded->layers[0].qkv.half[i], FloatToBFloat16(exact->layers[0].qkv.f32[i])) << i;
  }
}

// Pack (the CPU model's decode layout) keeps every value where RowsToFloat
// and SetRows see it, for fp32 and both 16-bit dtypes; shapes that do not
// pack, and int8, stay as they are.
TEST(WeightDTypeTest, PackedRowsReadAndWriteAsRowMajor) {
  const auto& ref = References()[1];
  auto config = LoadModelConfig(ref.dir);
  ASSERT_TRUE(config.ok());
  for (WeightDType dtype : {WeightDType::kFloat32, WeightDType::kFloat16, WeightDType::kBFloat16}) {
    SCOPED_TRACE(WeightDTypeName(dtype));
    auto w = DummyWeights(*config, {}, 7, dtype);
    ASSERT_TRUE(w.ok());
    WeightMatrix m = w->layers[0].gate_up;
    const std::vector<float> want = m.ToFloat();
    const WeightMatrix before = m;
    ASSERT_TRUE(m.Pack());
    EXPECT_TRUE(m.packed);
    EXPECT_TRUE(m.f32 != before.f32 || m.half != before.half);  // moved
    EXPECT_EQ(m.ToFloat(), want);
    EXPECT_FALSE(m.Pack());  // once
    // Rows 3..9 rewritten (a group boundary inside), the rest kept; the
    // values are exact in every dtype.
    std::vector<float> rows(static_cast<size_t>(6 * m.cols));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 64) * 0.25f;
    m.SetRows(3, 6, rows.data());
    std::vector<float> expect = want;
    std::copy(rows.begin(), rows.end(), expect.begin() + 3 * m.cols);
    EXPECT_EQ(m.ToFloat(), expect);
    std::vector<float> some(static_cast<size_t>(5 * m.cols));
    m.RowsToFloat(2, 5, some.data());
    EXPECT_TRUE(std::equal(some.begin(), some.end(), expect.begin() + 2 * m.cols));
    WeightMatrix odd = WeightMatrix::Zeros(dtype, 6, 16);
    EXPECT_FALSE(odd.Pack());  // 6 rows: not a multiple of 4
  }
  WeightMatrix int8 = WeightMatrix::Zeros(WeightDType::kInt8, 8, 32);
  EXPECT_FALSE(int8.Pack());
}

// Tensor-parallel shards quantize each row's blocks where the whole model
// does: a shard's int8 down_proj (its input columns) is a slice of the whole.
TEST(WeightDTypeTest, Int8ShardsAreSlicesOfTheWhole) {
  const auto& ref = References()[1];  // intermediate 256: 128 columns a rank
  auto config = LoadModelConfig(ref.dir);
  ASSERT_TRUE(config.ok());
  auto whole = LoadWeights(ref.dir, *config, {}, WeightDType::kInt8);
  auto rank1 = LoadWeights(ref.dir, *config, {1, 2}, WeightDType::kInt8);
  ASSERT_TRUE(whole.ok() && rank1.ok());
  const WeightMatrix& w = whole->layers[1].down;
  const WeightMatrix& s = rank1->layers[1].down;
  ASSERT_EQ(s.cols, 128);
  ASSERT_EQ(s.block, kInt8Block);
  // The whole (256 columns) is stored interleaved, the shard (128) in column order.
  ASSERT_TRUE(w.interleaved);
  ASSERT_FALSE(s.interleaved);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t c = 0; c < s.cols; ++c) {
      ASSERT_EQ(s.q[r * 128 + c], w.q[cpu::Int8InterleavedIndex(r, 128 + c, 256)]);
    }
    for (int64_t b = 0; b < 128 / kInt8Block; ++b) {
      ASSERT_EQ(s.scales[r * 4 + b], w.scales[r * 8 + 4 + b]);
    }
  }
}

// A checkpoint saved in 16 bits, run with its matrices kept 16-bit (auto),
// gives the logits of the same checkpoint widened to fp32: the kernels read
// the same values and sum them in the same order.
TEST(WeightDTypeTest, SixteenBitCheckpointKeptSixteenBitEqualsFp32) {
  for (const auto& ref : References()) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const std::string dir = testing::MakeTempDir("chunkattn-wdtype");
      auto config = LoadModelConfig(ref.dir);
      auto weights = LoadWeights(ref.dir, *config, {});
      ASSERT_TRUE(weights.ok());
      ASSERT_TRUE(SaveModel(dir, *config, *weights, dtype).ok());
      auto widened = Load(dir, WeightDType::kFloat32);
      auto kept = Load(dir, WeightDType::kAuto);
      ASSERT_TRUE(widened && kept);
      const std::string where = ref.name + " " + DTypeName(dtype);
      for (size_t p = 0; p < ref.prompts.size(); ++p) {
        const Trace want = RunTrace(*widened, ref.prompts[p], nullptr);
        const Trace got = RunTrace(*kept, ref.prompts[p], nullptr);
        const Diff d = Compare(got, want);
        EXPECT_LE(d.max, 1e-6 * d.scale) << where << " prompt " << p;
        EXPECT_EQ(got.greedy, want.greedy) << where << " prompt " << p;
      }
      fs::remove_all(dir);
    }
  }
}

// Weights rounded from fp32 (16-bit) or quantized (int8) against the fp32
// model, teacher-forced on fp32's greedy tokens so every row compares the
// same inputs; bounds are relative to the largest fp32 logit.
TEST(WeightDTypeTest, RoundedAndInt8LogitsStayNearFp32) {
  struct Case {
    WeightDType dtype;
    double bound;  // max |diff| / max |logit|
  };
  // Measured maxima are about a third of these (printed below).
  const Case cases[] = {{WeightDType::kFloat16, 0.005}, {WeightDType::kBFloat16, 0.04}, {WeightDType::kInt8, 0.03}};
  std::printf("%-28s %-9s %10s %10s %10s %8s\n", "model", "weights", "max|diff|", "mean|diff|", "max|logit|",
              "greedy=");
  for (const auto& ref : References()) {
    auto fp32 = Load(ref.dir, WeightDType::kFloat32);
    ASSERT_TRUE(fp32);
    for (const Case& c : cases) {
      auto model = Load(ref.dir, c.dtype);
      ASSERT_TRUE(model);
      Diff worst;
      double sum_mean = 0;
      int total = 0;
      for (size_t p = 0; p < ref.prompts.size(); ++p) {
        const Trace want = RunTrace(*fp32, ref.prompts[p], nullptr);
        const Trace forced = RunTrace(*model, ref.prompts[p], &want.greedy);
        const Diff d = Compare(forced, want);
        const std::string where = ref.name + " " + WeightDTypeName(c.dtype) + " prompt " + std::to_string(p);
        EXPECT_LE(d.max, c.bound * d.scale) << where;
        worst.max = std::max(worst.max, d.max);
        worst.scale = std::max(worst.scale, d.scale);
        sum_mean += d.mean;
        const Trace free = RunTrace(*model, ref.prompts[p], nullptr);
        GreedyAgreesWhereMarginAllows(free, want, c.bound * d.scale, where);
        for (size_t s = 0; s < want.greedy.size() && free.greedy[s] == want.greedy[s]; ++s) ++total;
      }
      std::printf("%-28s %-9s %10.2e %10.2e %10.3f %4d/%-3d\n", ref.name.c_str(), WeightDTypeName(c.dtype), worst.max,
                  sum_mean / ref.prompts.size(), worst.scale, total,
                  static_cast<int>(ref.prompts.size() * (kSteps + 1)));
    }
  }
}

}  // namespace weight_dtype_test
}  // namespace chunkattn
