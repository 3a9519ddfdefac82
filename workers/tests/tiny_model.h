// A tiny Llama for plan-level tests: two layers, GQA, a vocabulary of 97,
// with dummy weights on a pool of 96 chunks of 16 tokens. The scheduler test
// runs its plans, the plan fuzzer its inputs, and the fuzz seed maker
// records plans on it: they must agree, so it has one home here.
#ifndef CHUNKATTN_WORKERS_TESTS_TINY_MODEL_H_
#define CHUNKATTN_WORKERS_TESTS_TINY_MODEL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "proto/model/model_config.h"
#include "workers/model/llama.h"
#include "workers/model/weights.h"

namespace chunkattn::testing {

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

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_WORKERS_TESTS_TINY_MODEL_H_
