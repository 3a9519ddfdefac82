// The worker's plan path from arbitrary bytes: an input is up to 8 plans on
// the wire (each a 4-byte little-endian length and a serialized
// internal.v1.StepPlan), run in order by a fresh PlanExecutor on a tiny
// model, as one Execute stream would. Each plan must be executed or refused
// with an error, never crash or touch memory outside the KV pool and the
// buffers (ASan). Mutation is structure-aware (proto_mutator.h): with the
// worker's bound on private ranges removed, the decode context with
// private_begin = -5 of finding 2 (reliability issue) is found in seconds.
// CHUNKATTN_FUZZ_PRINT=1 prints each plan run (to read a crash's input).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chunkattn/internal/v1/worker.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/proto_mutator.h"
#include "proto/plan/plan_proto.h"
#include "workers/server/plan_executor.h"
#include "workers/tests/tiny_model.h"

namespace {

using chunkattn::fuzz::Fail;

constexpr size_t kMaxPlans = 8;

// A fresh model per input, as each worker session has: a model keeps the
// decode plan of a context version for its lifetime, and the version
// counter starts again with every session (a shared model made an input's
// context version 1 meet an earlier input's plan for version 1).
std::unique_ptr<chunkattn::LlamaModel> FreshModel() {
  auto m = chunkattn::testing::MakeTinyModel();
  if (!m.ok()) Fail("plan_fuzz", std::string(m.status().message()));
  return std::move(*m);
}

}  // namespace

// Mostly: one field of one plan changed, or a plan dropped or repeated.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> plans = chunkattn::fuzz::SplitFrames(data, size, kMaxPlans);
  if (rng() % 5 == 0 || plans.empty()) return LLVMFuzzerMutate(data, size, max_size);
  const size_t pick = rng() % plans.size();
  if (rng() % 8 == 0) {
    if (plans.size() > 1 && rng() % 2 == 0) {
      plans.erase(plans.begin() + static_cast<long>(pick));
    } else if (plans.size() < kMaxPlans) {
      plans.insert(plans.begin() + static_cast<long>(pick), plans[pick]);
    }
  } else {
    chunkattn::internal::v1::StepPlan wire;
    if (!wire.ParseFromString(plans[pick])) return LLVMFuzzerMutate(data, size, max_size);
    chunkattn::fuzz::MutateMessage(&wire, rng);
    plans[pick] = wire.SerializeAsString();
  }
  return chunkattn::fuzz::ReplaceInput(chunkattn::fuzz::JoinFrames(plans), data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool print = std::getenv("CHUNKATTN_FUZZ_PRINT") != nullptr;
  const std::unique_ptr<chunkattn::LlamaModel> model = FreshModel();
  chunkattn::PlanExecutor executor(model.get(), /*samples=*/true);
  const int vocab = chunkattn::testing::TinyConfig().vocab_size;
  const std::vector<std::string> plans = chunkattn::fuzz::SplitFrames(data, size, kMaxPlans);
  for (size_t k = 0; k < plans.size(); ++k) {
    chunkattn::internal::v1::StepPlan wire;
    if (!wire.ParseFromString(plans[k])) continue;  // the stream would drop it: gRPC fails the read
    if (print) std::fprintf(stderr, "plan %zu:\n%s\n", k, wire.DebugString().c_str());
    chunkattn::StepPlan plan;
    if (!chunkattn::FromProto(wire, &plan).ok()) break;  // the worker ends the session, as on a failed step
    chunkattn::StepResult result;
    const absl::Status executed = executor.Execute(plan, &result);
    if (print) std::fprintf(stderr, "-> %s\n", executed.ToString().c_str());
    if (!executed.ok()) break;  // the session restarts
    for (int32_t token : result.tokens) {
      if (token < 0 || token >= vocab) {
        Fail("plan_fuzz", "sampled token " + std::to_string(token) + " outside the vocabulary");
      }
    }
  }
  return 0;
}
