// The public Generate request from arbitrary bytes, as gRPC would hand it
// over: parsed, translated (FromProto), then the input processor accepts it
// or refuses it with INVALID_ARGUMENT, never crashes. What it accepts must be servable without
// harming anyone else (accepted_request.h).
//
// The config is the tiny model's, without a tokenizer: text prompts are
// checked up to tokenization (bounds, emptiness). SentencePiece cannot load
// in a sanitizer build beside libprotobuf (text/spm_loader.cc); tokenizers
// of our own get their own harness.
#include <cstdint>
#include <memory>
#include <string>

#include "chunkattn/v1/generation.pb.h"
#include "tests/fuzz/accepted_request.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/proto_mutator.h"
#include "services/fronts/grpc/generation_service.h"
#include "workers/tests/tiny_model.h"

namespace {

using chunkattn::fuzz::Fail;

const chunkattn::ModelConfig& Config() {
  static const chunkattn::ModelConfig config = chunkattn::testing::TinyConfig();
  return config;
}

}  // namespace

// Mostly one field changed through reflection (proto_mutator.h).
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return chunkattn::fuzz::MutateSerialized<chunkattn::v1::GenerateRequest>(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chunkattn::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;  // gRPC refuses it before us
  auto translated = chunkattn::FromProto(request);
  if (!translated.ok()) {
    if (translated.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("generate_request_fuzz", "translation refused with " + translated.status().ToString() +
                                        " instead of INVALID_ARGUMENT");
    }
    return 0;
  }
  if (!translated->sampling.seed.has_value()) translated->sampling.seed = 42;  // a crash replays
  auto valid = chunkattn::ProcessInput(*translated, Config(), chunkattn::PromptText{});
  if (!valid.ok()) {
    if (valid.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("generate_request_fuzz", "refused with " + valid.status().ToString() + " instead of INVALID_ARGUMENT");
    }
    return 0;
  }
  chunkattn::fuzz::CheckAcceptedRequest("generate_request_fuzz", *valid, Config(), data, size);
  return 0;
}
