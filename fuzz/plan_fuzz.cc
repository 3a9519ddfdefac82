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
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chunkattn/internal/v1/worker.pb.h"
#include "fuzz/proto_mutator.h"
#include "workers/tests/tiny_model.h"
#include "plan/plan_proto.h"
#include "workers/server/plan_executor.h"

namespace {

// A fresh model per input, as each worker session has: a model keeps the
// decode plan of a context version for its lifetime, and the version
// counter starts again with every session (a shared model made an input's
// context version 1 meet an earlier input's plan for version 1).
std::unique_ptr<chunkattn::LlamaModel> FreshModel() {
  auto m = chunkattn::testing::MakeTinyModel();
  if (!m.ok()) {
    std::fprintf(stderr, "plan_fuzz: %s\n", std::string(m.status().message()).c_str());
    std::abort();
  }
  return std::move(*m);
}

// An input's framed plans; false when the bytes are not such frames.
bool Unframe(const uint8_t* data, size_t size, std::vector<std::string>* plans) {
  while (size >= 4 && plans->size() < 8) {
    uint32_t len = 0;
    std::memcpy(&len, data, 4);
    data += 4, size -= 4;
    if (len > size) return false;
    plans->emplace_back(reinterpret_cast<const char*>(data), len);
    data += len, size -= len;
  }
  return size == 0 && !plans->empty();
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Mostly: one field of one plan changed, or a plan dropped or repeated.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> plans;
  if (rng() % 5 == 0 || !Unframe(data, size, &plans)) return LLVMFuzzerMutate(data, size, max_size);
  const size_t pick = rng() % plans.size();
  if (rng() % 8 == 0) {
    if (plans.size() > 1 && rng() % 2 == 0) {
      plans.erase(plans.begin() + static_cast<long>(pick));
    } else if (plans.size() < 8) {
      plans.insert(plans.begin() + static_cast<long>(pick), plans[pick]);
    }
  } else {
    chunkattn::internal::v1::StepPlan wire;
    if (!wire.ParseFromString(plans[pick])) return LLVMFuzzerMutate(data, size, max_size);
    chunkattn::fuzz::MutateMessage(&wire, rng);
    plans[pick] = wire.SerializeAsString();
  }
  std::string out;
  for (const std::string& p : plans) {
    const uint32_t len = static_cast<uint32_t>(p.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += p;
  }
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::unique_ptr<chunkattn::LlamaModel> model = FreshModel();
  chunkattn::PlanExecutor executor(model.get(), /*samples=*/true);
  const int vocab = chunkattn::testing::TinyConfig().vocab_size;
  for (int k = 0; k < 8 && size >= 4; ++k) {
    uint32_t len = 0;
    std::memcpy(&len, data, 4);
    data += 4, size -= 4;
    len = static_cast<uint32_t>(std::min<size_t>(len, size));
    chunkattn::internal::v1::StepPlan wire;
    const bool parsed = wire.ParseFromArray(data, static_cast<int>(len));
    data += len, size -= len;
    if (!parsed) continue;  // the stream would drop it: gRPC fails the read
    if (std::getenv("CHUNKATTN_FUZZ_PRINT") != nullptr) {  // to read a crash's input
      std::fprintf(stderr, "plan %d:\n%s\n", k, wire.DebugString().c_str());
    }
    chunkattn::StepPlan plan;
    chunkattn::FromProto(wire, &plan);
    chunkattn::StepResult result;
    const absl::Status executed = executor.Execute(plan, &result);
    if (std::getenv("CHUNKATTN_FUZZ_PRINT") != nullptr) std::fprintf(stderr, "-> %s\n", executed.ToString().c_str());
    if (!executed.ok()) break;  // the session restarts
    for (int32_t token : result.tokens) {
      if (token < 0 || token >= vocab) {
        std::fprintf(stderr, "plan_fuzz: sampled token %d outside the vocabulary\n", token);
        std::abort();
      }
    }
  }
  return 0;
}
