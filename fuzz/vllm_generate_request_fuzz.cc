// vllm.grpc.engine.VllmEngine's Generate request from arbitrary bytes, as
// gRPC would hand it over: TranslateVllmRequest and then the same
// ValidateGenerateRequest as our own API (with vLLM's max_tokens rules)
// accept it or refuse it with INVALID_ARGUMENT, never crash; what they
// accept must be servable without harming anyone else (accepted_request.h).
// The config is the tiny model's, without a tokenizer (as
// generate_request_fuzz.cc).
#include <cstdint>
#include <string>

#include "fuzz/accepted_request.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/proto_mutator.h"
#include "services/coordinator/generation_service.h"
#include "services/coordinator/vllm_engine_service.h"
#include "vllm/grpc/engine/vllm_engine.pb.h"
#include "workers/tests/tiny_model.h"

namespace {

using chunkattn::fuzz::Fail;
constexpr char kHarness[] = "vllm_generate_request_fuzz";

const chunkattn::ModelConfig& Config() {
  static const chunkattn::ModelConfig config = chunkattn::testing::TinyConfig();
  return config;
}

}  // namespace

// Mostly one field changed through reflection (proto_mutator.h).
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return chunkattn::fuzz::MutateSerialized<vllm::grpc::engine::GenerateRequest>(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vllm::grpc::engine::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;  // gRPC refuses it before us
  auto translated = chunkattn::TranslateVllmRequest(request);
  if (!translated.ok()) {
    if (translated.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail(kHarness, "translation refused with " + translated.status().ToString() + " instead of INVALID_ARGUMENT");
    }
    return 0;
  }
  auto valid = chunkattn::ValidateGenerateRequest(translated->request, Config(), chunkattn::PromptText{},
                                                  /*seed=*/42, translated->fill_context, /*cap_to_context=*/true);
  if (!valid.ok()) {
    if (valid.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail(kHarness, "refused with " + valid.status().ToString() + " instead of INVALID_ARGUMENT");
    }
    return 0;
  }
  if (valid->request_id.empty()) Fail(kHarness, "accepted a request without an id (Abort could not name it)");
  chunkattn::fuzz::CheckAcceptedRequest(kHarness, *valid, Config(), data, size);
  return 0;
}
