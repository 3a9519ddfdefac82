// The model the plan fuzzer runs plans on, and the seed maker records plans
// for: two layers, GQA, 96 chunks of 16 tokens. Both must agree on it, so
// it has one home here.
#ifndef CHUNKATTN_FUZZ_TINY_MODEL_H_
#define CHUNKATTN_FUZZ_TINY_MODEL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "config/model_config.h"
#include "workers/model/llama.h"
#include "workers/model/weights.h"

namespace chunkattn::fuzz {

inline constexpr int kTinyChunkSize = 16;
inline constexpr int kTinyChunks = 96;

inline ModelConfig TinyConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_context = 512;
  c.eos_token_ids = {96};
  return c;
}

inline absl::StatusOr<std::unique_ptr<LlamaModel>> MakeTinyModel() {
  const ModelConfig config = TinyConfig();
  absl::StatusOr<ModelWeights> weights = DummyWeights(config, {0, 1}, 7);
  if (!weights.ok()) return weights.status();
  ModelOptions options;
  options.chunk_size = kTinyChunkSize;
  options.num_kv_chunks = kTinyChunks;
  return LlamaModel::Create(config, std::move(*weights), options, nullptr, nullptr);
}

}  // namespace chunkattn::fuzz

#endif  // CHUNKATTN_FUZZ_TINY_MODEL_H_
