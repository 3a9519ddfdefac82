// Loading a Hugging Face model folder: config.json variants, safetensors
// validation, fp16/bf16 and sharded checkpoints, TP slices, dummy weights.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "proto/model/model_config.h"
#include "gtest/gtest.h"
#include "workers/model/safetensors.h"
#include "workers/model/weights.h"
#include "workers/tests/model_test_util.h"

namespace chunkattn {
namespace {

namespace fs = std::filesystem;

// Removed by the test when it gets that far, and at exit in any case (an
// ASSERT that fails returns before the test's own remove_all).
std::string TempDir() { return testing::MakeTempDir("chunkattn-loader"); }

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

constexpr char kLlama2[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
  "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
  "num_attention_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
  "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false,
  "rope_scaling": null, "hidden_act": "silu"})";

TEST(ConfigTest, Llama2Defaults) {
  auto c = ParseModelConfig(kLlama2, "llama2/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 32);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->max_context, 4096);
  EXPECT_EQ(c->dtype, DType::kFloat16);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{2});
}

TEST(ConfigTest, Llama3ScalingMistralWindowQwen2BiasAndTransformers5) {
  auto llama3 = ParseModelConfig(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
    "max_position_embeddings": 131072, "eos_token_id": [128001, 128008, 128009],
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})",
                                 "llama3");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->rope_scaling.kind, RopeScalingKind::kLlama3);
  EXPECT_EQ(llama3->eos_token_ids.size(), 3u);
  EXPECT_EQ(llama3->num_kv_heads, 8);

  auto mistral = ParseModelConfig(R"({"architectures": ["MistralForCausalLM"], "vocab_size": 32000,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    "sliding_window": 4096})",
                                  "mistral");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->max_context, 4096);  // the window caps the full-attention context

  auto qwen = ParseModelConfig(R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": true,
    "sliding_window": 32768, "use_sliding_window": false, "max_position_embeddings": 32768})",
                               "qwen2");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE(qwen->attention_bias);
  EXPECT_TRUE(qwen->tie_word_embeddings);
  EXPECT_EQ(qwen->head_dim, 64);
  EXPECT_EQ(qwen->max_context, 32768);
  // Qwen2's q/k/v always have biases: transformers ignores attention_bias
  // there, so a false one must not survive (nor break the JSON round trip;
  // found by tests/fuzz/).
  auto qwen_no_bias = ParseModelConfig(R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 100,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
    "attention_bias": false})",
                                       "qwen2");
  ASSERT_TRUE(qwen_no_bias.ok()) << qwen_no_bias.status();
  EXPECT_TRUE(qwen_no_bias->attention_bias);
  EXPECT_TRUE(ParseModelConfig(ModelConfigToJson(*qwen_no_bias), "again")->attention_bias);
  EXPECT_FALSE(qwen_no_bias->qk_norm);

  auto v5 = ParseModelConfig(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 100,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 4, "dtype": "bfloat16",
    "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}})",
                             "v5");
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_EQ(v5->rope_theta, 1000.0);
  EXPECT_EQ(v5->rope_scaling.kind, RopeScalingKind::kLinear);
  EXPECT_EQ(v5->dtype, DType::kBFloat16);
}

// Qwen3-0.6B's config.json (abridged): head_dim apart from hidden / heads,
// q/k norms implied by the architecture, attention_bias read (false here).
constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
  "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "attention_bias": false, "hidden_act": "silu", "max_position_embeddings": 40960,
  "max_window_layers": 28, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "bos_token_id": 151643, "eos_token_id": 151645})";

TEST(ConfigTest, Qwen3HeadDimAndQkNorm) {
  auto c = ParseModelConfig(kQwen3, "qwen3/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_size(), 2048);  // not hidden_size
  EXPECT_EQ(c->kv_size(), 1024);
  EXPECT_EQ(c->max_context, 40960);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  auto again = ParseModelConfig(ModelConfigToJson(*c), "roundtrip");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->qk_norm);
  EXPECT_EQ(ModelConfigToJson(*again), ModelConfigToJson(*c));
  EXPECT_FALSE(ParseModelConfig(kLlama2, "llama2")->qk_norm);

  auto edited = [](const std::string& from, const std::string& to) {
    std::string text = kQwen3;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    return ParseModelConfig(text, "qwen3/config.json");
  };
  // Qwen3Config's defaults: head_dim 128 (not hidden / heads = 64), no bias.
  auto no_head_dim = edited("\"head_dim\": 128,", "");
  ASSERT_TRUE(no_head_dim.ok()) << no_head_dim.status();
  EXPECT_EQ(no_head_dim->head_dim, 128);
  auto no_bias_field = edited("\"attention_bias\": false,", "");
  ASSERT_TRUE(no_bias_field.ok()) << no_bias_field.status();
  EXPECT_FALSE(no_bias_field->attention_bias);
  auto bias = edited("\"attention_bias\": false", "\"attention_bias\": true");
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_TRUE(bias->attention_bias);
  EXPECT_TRUE(bias->qk_norm);
  // Like Qwen2's, the window applies to the top layers only.
  auto window = edited("\"sliding_window\": null", "\"sliding_window\": 4096");
  ASSERT_TRUE(window.ok()) << window.status();  // without use_sliding_window, the window is off
  EXPECT_EQ(window->max_context, 40960);
  window = edited("\"sliding_window\": null", "\"sliding_window\": 4096, \"use_sliding_window\": true");
  EXPECT_EQ(window.status().code(), absl::StatusCode::kUnimplemented) << window.status();
  EXPECT_NE(window.status().message().find("Qwen3"), std::string::npos) << window.status();
}

TEST(ConfigTest, RejectsBadConfigsNamingTheField) {
  struct Case {
    std::string edit_from, edit_to, field;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"\"vocab_size\": 32000", "\"vocab_size\": -3", "vocab_size", absl::StatusCode::kInvalidArgument},
      {"\"vocab_size\": 32000", "\"vocab_size\": \"many\"", "vocab_size", absl::StatusCode::kInvalidArgument},
      {"\"hidden_size\": 4096,", "", "hidden_size", absl::StatusCode::kInvalidArgument},
      {"LlamaForCausalLM", "GPT2LMHeadModel", "GPT2LMHeadModel", absl::StatusCode::kUnimplemented},
      {"\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", "yarn",
       absl::StatusCode::kUnimplemented},
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "gelu", absl::StatusCode::kUnimplemented},
      {"\"eos_token_id\": 2", "\"eos_token_id\": 40000", "eos_token_id", absl::StatusCode::kInvalidArgument},
      {"\"torch_dtype\": \"float16\"", "\"torch_dtype\": \"int8\"", "torch_dtype", absl::StatusCode::kInvalidArgument},
      {"\"num_attention_heads\": 32", "\"num_attention_heads\": 32, \"num_key_value_heads\": 5",
       "num_key_value_heads", absl::StatusCode::kInvalidArgument},
      {"{", "[", "JSON", absl::StatusCode::kInvalidArgument},
      // A head_dim derived from the sizes has the explicit one's bound (found by tests/fuzz/).
      {"\"num_attention_heads\": 32", "\"num_attention_heads\": 2", "head_dim 2048",
       absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    std::string text = kLlama2;
    const size_t at = text.find(c.edit_from);
    ASSERT_NE(at, std::string::npos) << c.edit_from;
    text.replace(at, c.edit_from.size(), c.edit_to);
    auto parsed = ParseModelConfig(text, "bad/config.json");
    ASSERT_FALSE(parsed.ok()) << c.edit_to;
    EXPECT_EQ(parsed.status().code(), c.code) << parsed.status();
    EXPECT_NE(parsed.status().message().find(c.field), std::string::npos) << parsed.status();
    EXPECT_NE(parsed.status().message().find("bad/config.json"), std::string::npos);
  }
}

TEST(ConfigTest, GenerationConfigEosWins) {
  const std::string dir = TempDir();
  WriteFile(dir + "/config.json", kLlama2);
  ASSERT_EQ(LoadModelConfig(dir)->eos_token_ids, std::vector<int32_t>{2});
  WriteFile(dir + "/generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 31999, 7]})");
  auto c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2, 31999, 7}));
  WriteFile(dir + "/generation_config.json", R"({"temperature": 0.6})");  // no eos: config.json's
  EXPECT_EQ(LoadModelConfig(dir)->eos_token_ids, std::vector<int32_t>{2});
  for (const char* bad : {R"({"eos_token_id": 32000})", R"({"eos_token_id": ["2"]})", "not json"}) {
    WriteFile(dir + "/generation_config.json", bad);
    c = LoadModelConfig(dir);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(c.status().message().find("generation_config.json"), std::string::npos) << c.status();
  }
  fs::remove_all(dir);
}

TEST(ConfigTest, JsonRoundTrip) {
  for (const auto& ref : testing::References()) {
    auto c = LoadModelConfig(ref.dir);
    ASSERT_TRUE(c.ok()) << ref.name;
    auto again = ParseModelConfig(ModelConfigToJson(*c), "roundtrip");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(ModelConfigToJson(*again), ModelConfigToJson(*c)) << ref.name;
    EXPECT_EQ(again->qk_norm, c->qk_norm) << ref.name;
  }
}

TEST(SafetensorsTest, RoundTripAndValidation) {
  const std::string dir = TempDir();
  std::vector<TensorToWrite> tensors(2);
  tensors[0] = {"a", DType::kFloat32, {2, 3}, std::vector<uint8_t>(24, 0)};
  tensors[1] = {"b", DType::kBFloat16, {4}, std::vector<uint8_t>(8, 0)};
  const float values[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
  std::memcpy(tensors[0].bytes.data(), values, 24);
  const std::string path = dir + "/t.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  {
    auto f = SafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    auto a = (*f)->Get("a");
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
    float out[6];
    ToFloat(*a, 0, 6, out);
    EXPECT_EQ(std::memcmp(out, values, 24), 0);
    EXPECT_EQ((*f)->Get("c").status().code(), absl::StatusCode::kNotFound);
  }
  const std::string good = ReadFile(path);
  auto open_bytes = [&](const std::string& bytes) {
    WriteFile(dir + "/bad.safetensors", bytes);
    return SafetensorsFile::Open(dir + "/bad.safetensors").status();
  };
  // Truncated anywhere: inside the length, the header, or the data.
  for (size_t len : {size_t{0}, size_t{5}, size_t{20}, good.size() - 1}) {
    const absl::Status st = open_bytes(good.substr(0, len));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << len << ": " << st;
    EXPECT_NE(st.message().find("bad.safetensors"), std::string::npos);
  }
  std::string huge = good;
  huge[7] = 0x7f;  // header length of ~9e18 bytes
  EXPECT_EQ(open_bytes(huge).code(), absl::StatusCode::kInvalidArgument);
  std::string mangled = good;
  mangled.replace(mangled.find("[2,3]"), 5, "[2,4]");  // shape needs more bytes than it has
  const absl::Status st = open_bytes(mangled);
  EXPECT_NE(st.message().find("tensor \"a\""), std::string::npos) << st;
  std::string not_json = good;
  not_json[8] = '#';
  EXPECT_EQ(open_bytes(not_json).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsFile::Open(dir + "/missing.safetensors").status().code(),
            absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

// Writes the fp32 llama3_gqa fixture back out in another dtype or sharded.
std::string Resave(const std::string& src, DType dtype, int64_t shard_bytes) {
  auto config = LoadModelConfig(src);
  auto weights = LoadWeights(src, *config, {});
  EXPECT_TRUE(weights.ok());
  const std::string dir = TempDir();
  const absl::Status st = SaveModel(dir, *config, *weights, dtype, shard_bytes);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

TEST(WeightsTest, HalfPrecisionAndShardedCheckpoints) {
  for (const auto& ref : testing::References()) {
    auto fp32 = testing::LoadModelOrDie(ref.dir);
    std::vector<int32_t> prompt = ref.prompts[2];
    auto expect = testing::PrefillPiece(*fp32, prompt, 0, testing::Chunks(0, 2));

    const std::string sharded = Resave(ref.dir, DType::kFloat32, 100000);
    ASSERT_TRUE(fs::exists(sharded + "/model.safetensors.index.json"));
    ASSERT_FALSE(fs::exists(sharded + "/model.safetensors"));
    auto sharded_model = testing::LoadModelOrDie(sharded);
    auto got = testing::PrefillPiece(*sharded_model, prompt, 0, testing::Chunks(0, 2));
    EXPECT_EQ(got, expect) << "sharded fp32 must be bit-identical";

    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const std::string dir = Resave(ref.dir, dtype, 0);
      auto model = testing::LoadModelOrDie(dir);
      auto logits = testing::PrefillPiece(*model, prompt, 0, testing::Chunks(0, 2));
      const double err = testing::RelError(logits.data(), expect.data(), expect.size());
      EXPECT_LT(err, dtype == DType::kFloat16 ? 1e-2 : 5e-2) << ref.name << " " << DTypeName(dtype);
      EXPECT_GT(err, 0) << "weights were not rounded";
      fs::remove_all(dir);
    }
    fs::remove_all(sharded);
  }
}

TEST(WeightsTest, ErrorsNameTheFileAndTensor) {
  const auto& ref = testing::References()[0];
  auto config = LoadModelConfig(ref.dir);
  ASSERT_TRUE(config.ok());
  // A missing tensor.
  const std::string dir = Resave(ref.dir, DType::kFloat32, 0);
  {
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    std::vector<TensorToWrite> keep;
    for (const std::string& name : (*file)->Names()) {
      if (name == "model.layers.1.mlp.up_proj.weight") continue;
      auto t = (*file)->Get(name);
      keep.push_back({name, t->dtype, t->shape,
                      std::vector<uint8_t>(t->data, t->data + t->num_elements() * 4)});
    }
    file->reset();
    ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", keep).ok());
  }
  auto missing = LoadWeights(dir, *config, {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos);
  EXPECT_NE(missing.status().message().find(dir + "/model.safetensors"), std::string::npos);

  // A shape the config does not expect.
  ModelConfig wider = *config;
  wider.intermediate_size *= 2;
  auto wrong = LoadWeights(ref.dir, wider, {});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("mlp.gate_proj.weight"), std::string::npos) << wrong.status();

  // A truncated file.
  std::string bytes = ReadFile(ref.dir + "/model.safetensors");
  WriteFile(dir + "/model.safetensors", bytes.substr(0, bytes.size() / 2));
  auto truncated = LoadWeights(dir, *config, {});
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.status().message().find("model.safetensors"), std::string::npos);

  // An index naming a shard that is not there.
  WriteFile(dir + "/model.safetensors.index.json",
            R"({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})");
  EXPECT_EQ(LoadWeights(dir, *config, {}).status().code(), absl::StatusCode::kNotFound);
  WriteFile(dir + "/model.safetensors.index.json", R"({"weight_map": {"x": "../etc/passwd"}})");
  EXPECT_EQ(LoadWeights(dir, *config, {}).status().code(), absl::StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

// Qwen3's q_norm / k_norm: (head_dim) each, whole on every tensor-parallel
// rank; missing or misshapen ones are named; a model refuses weights that lack
// them, and dummy weights have them (ones).
TEST(WeightsTest, Qwen3QkNorms) {
  const testing::Reference* ref = nullptr;
  for (const auto& r : testing::References()) {
    if (r.name == "numpy/qwen3_qk_norm") ref = &r;
  }
  ASSERT_NE(ref, nullptr);
  auto config = LoadModelConfig(ref->dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->qk_norm);
  const int d = config->head_dim;
  auto whole = LoadWeights(ref->dir, *config, {});
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const LayerWeights& l : whole->layers) {
    ASSERT_EQ(l.q_norm.size(), static_cast<size_t>(d));
    ASSERT_EQ(l.k_norm.size(), static_cast<size_t>(d));
    EXPECT_NE(l.q_norm, l.k_norm);
  }
  for (int world : {2, 4}) {  // TP 4 replicates the 2 KV heads
    for (int rank = 0; rank < world; ++rank) {
      auto shard = LoadWeights(ref->dir, *config, {rank, world});
      ASSERT_TRUE(shard.ok()) << shard.status();
      for (int i = 0; i < config->num_layers; ++i) {
        EXPECT_EQ(shard->layers[i].q_norm, whole->layers[i].q_norm) << "rank " << rank << " of " << world;
        EXPECT_EQ(shard->layers[i].k_norm, whole->layers[i].k_norm) << "rank " << rank << " of " << world;
      }
    }
  }
  auto dummy = DummyWeights(*config, {1, 2}, 7);
  ASSERT_TRUE(dummy.ok()) << dummy.status();
  EXPECT_EQ(dummy->layers[1].q_norm, std::vector<float>(d, 1.0f));
  EXPECT_EQ(dummy->layers[1].k_norm, std::vector<float>(d, 1.0f));

  // A checkpoint written with the norms (SaveModel), then without one of them.
  const std::string dir = Resave(ref->dir, DType::kFloat32, 0);
  auto resaved = LoadWeights(dir, *config, {});
  ASSERT_TRUE(resaved.ok()) << resaved.status();
  EXPECT_EQ(resaved->layers[1].k_norm, whole->layers[1].k_norm);
  {
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    std::vector<TensorToWrite> keep;
    for (const std::string& name : (*file)->Names()) {
      if (name == "model.layers.1.self_attn.k_norm.weight") continue;
      auto t = (*file)->Get(name);
      keep.push_back({name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->num_elements() * 4)});
    }
    file->reset();
    ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", keep).ok());
  }
  auto missing = LoadWeights(dir, *config, {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("model.layers.1.self_attn.k_norm.weight"), std::string::npos)
      << missing.status();
  // A q_norm of (d / 2) values.
  {
    auto file = SafetensorsFile::Open(ref->dir + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    std::vector<TensorToWrite> edited;
    for (const std::string& name : (*file)->Names()) {
      auto t = (*file)->Get(name);
      std::vector<int64_t> shape = t->shape;
      int64_t n = t->num_elements();
      if (name == "model.layers.0.self_attn.q_norm.weight") {
        shape = {d / 2};
        n = d / 2;
      }
      edited.push_back({name, t->dtype, shape, std::vector<uint8_t>(t->data, t->data + n * 4)});
    }
    ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", edited).ok());
  }
  auto misshapen = LoadWeights(dir, *config, {});
  EXPECT_EQ(misshapen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(misshapen.status().message().find("model.layers.0.self_attn.q_norm.weight"), std::string::npos)
      << misshapen.status();

  // The model refuses Qwen3 weights without the norms, and norms on a model without them.
  ModelOptions options;
  options.chunk_size = 16;
  options.num_kv_chunks = 8;
  ModelWeights stripped = *whole;
  stripped.layers[1].q_norm.clear();
  EXPECT_EQ(LlamaModel::Create(*config, std::move(stripped), options, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelConfig plain = *config;
  plain.qk_norm = false;
  EXPECT_EQ(LlamaModel::Create(plain, *whole, options, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(WeightsTest, ShardLayoutsAndDummyWeightsAreSlicesOfTheWhole) {
  const auto& ref = testing::References()[1];  // 8 heads, 2 KV heads, intermediate 256
  auto config = LoadModelConfig(ref.dir);
  ASSERT_TRUE(config.ok());
  EXPECT_FALSE(MakeShardLayout(*config, {0, 3}).ok());
  EXPECT_FALSE(MakeShardLayout(*config, {2, 2}).ok());
  auto l4 = MakeShardLayout(*config, {3, 4});
  ASSERT_TRUE(l4.ok());
  EXPECT_EQ(l4->num_heads, 2);
  EXPECT_EQ(l4->num_kv_heads, 1);
  EXPECT_EQ(l4->kv_head_begin, 1);  // ranks 2, 3 replicate KV head 1
  EXPECT_EQ(l4->intermediate_begin, 192);

  auto whole = DummyWeights(*config, {}, 7);
  auto again = DummyWeights(*config, {}, 7);
  auto other = DummyWeights(*config, {}, 8);
  auto rank1 = DummyWeights(*config, {1, 2}, 7);
  ASSERT_TRUE(whole.ok() && again.ok() && other.ok() && rank1.ok());
  EXPECT_EQ(whole->layers[0].qkv.f32, again->layers[0].qkv.f32);
  EXPECT_NE(whole->layers[0].qkv.f32, other->layers[0].qkv.f32);
  // Rank 1 of 2 holds q heads 4..7: rows 64..127 of the whole q block.
  const int hidden = config->hidden_size;
  std::vector<float> expect(whole->layers[0].qkv.f32.begin() + 64 * hidden,
                            whole->layers[0].qkv.f32.begin() + 128 * hidden);
  std::vector<float> got(rank1->layers[0].qkv.f32.begin(), rank1->layers[0].qkv.f32.begin() + 64 * hidden);
  EXPECT_EQ(got, expect);
  // And its down_proj columns 128..255.
  for (int r = 0; r < hidden; ++r) {
    for (int c = 0; c < 128; ++c) {
      ASSERT_EQ(rank1->layers[1].down.f32[r * 128 + c], whole->layers[1].down.f32[r * 256 + 128 + c]);
    }
  }
  // Dummy weights run: logits finite.
  ModelOptions options;
  options.chunk_size = 16;
  options.num_kv_chunks = 8;
  auto model = LlamaModel::Create(*config, std::move(*whole), options, nullptr, nullptr);
  ASSERT_TRUE(model.ok());
  auto logits = testing::PrefillPiece(**model, {1, 2, 3}, 0, {0});
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace chunkattn
