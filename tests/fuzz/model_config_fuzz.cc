// config.json from arbitrary bytes: ParseModelConfig accepts or refuses it,
// never crashes; what it accepts satisfies what the model code assumes, and
// survives a round trip through ModelConfigToJson unchanged.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string_view>

#include "proto/model/model_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using chunkattn::fuzz::Fail;


bool Same(const chunkattn::ModelConfig& a, const chunkattn::ModelConfig& b) {
  return a.architecture == b.architecture && a.model_type == b.model_type && a.vocab_size == b.vocab_size &&
         a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_layers == b.num_layers && a.num_heads == b.num_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.rope_scaling.kind == b.rope_scaling.kind && a.rope_scaling.factor == b.rope_scaling.factor &&
         a.max_context == b.max_context && a.tie_word_embeddings == b.tie_word_embeddings &&
         a.attention_bias == b.attention_bias && a.qk_norm == b.qk_norm && a.dtype == b.dtype &&
         a.bos_token_id == b.bos_token_id && a.eos_token_ids == b.eos_token_ids;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto config = chunkattn::ParseModelConfig(json, "fuzz/config.json");
  if (!config.ok()) {
    if (config.status().message().find("fuzz/config.json") == std::string_view::npos) {
      Fail("model_config_fuzz", "an error that does not name the file");
    }
    return 0;
  }
  const chunkattn::ModelConfig& c = *config;
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 ||
      c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 || c.max_context <= 0) {
    Fail("model_config_fuzz", "accepted a non-positive size");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    Fail("model_config_fuzz", "accepted heads that are not a multiple of the KV heads");
  }
  if (c.head_dim % 2 != 0) Fail("model_config_fuzz", "accepted an odd head_dim (rotary embeddings pair dimensions)");
  for (int32_t eos : c.eos_token_ids) {
    if (eos < 0 || eos >= c.vocab_size) Fail("model_config_fuzz", "accepted an EOS id outside the vocabulary");
  }
  if (c.bos_token_id >= c.vocab_size) Fail("model_config_fuzz", "accepted a BOS id outside the vocabulary");
  auto again = chunkattn::ParseModelConfig(chunkattn::ModelConfigToJson(c), "round trip");
  if (!again.ok()) Fail("model_config_fuzz", "its own JSON does not parse again");
  if (!Same(c, *again)) Fail("model_config_fuzz", "the round trip changed the config");
  return 0;
}
