// vllm.grpc.engine.VllmEngine's Generate request from arbitrary bytes, as
// gRPC would hand it over: TranslateVllmRequest (with vLLM's max_tokens
// rules) and then the same input processor as every front accept it or
// refuse it with INVALID_ARGUMENT, never crash; what they
// accept must be servable without harming anyone else (accepted_request.h).
// The config is the tiny model's, without a tokenizer (as
// generate_request_fuzz.cc).
#include <cstdint>
#include <string>

#include "tests/fuzz/accepted_request.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/proto_mutator.h"
#include "services/coordinator/input_processor.h"
#include "services/fronts/vllm/vllm_service.h"
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
  if (!translated->sampling.seed.has_value()) translated->sampling.seed = 42;  // a crash replays
  auto valid = chunkattn::ProcessInput(*translated, Config(), chunkattn::PromptText{});
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
