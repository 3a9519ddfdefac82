// Writes the seed corpora of tests/fuzz/corpus/ (committed; rerun after a format
// change): real plans recorded from the scheduler driving the tiny model,
// Generate requests of every prompt and parameter kind, safetensors files
// and indexes, and walks for the prefix forest.
//
//   chunkattn-fuzz-seeds tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/file.h"
#include "chunkattn/internal/v1/worker.pb.h"
#include "chunkattn/v1/generation.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "proto/plan/plan_proto.h"
#include "vllm/grpc/engine/vllm_engine.pb.h"
#include "services/core/scheduler.h"
#include "workers/model/safetensors.h"
#include "workers/server/plan_executor.h"
#include "workers/tests/tiny_model.h"

namespace chunkattn::fuzz {
namespace {

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  WriteFile(dir + "/" + name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// The plans of a small workload with shared prefixes, n = 2, chunked
// prefill and a pool tight enough to preempt, in the order they ran.
std::vector<std::string> RecordPlans() {
  auto model = testing::MakeTinyModel();
  if (!model.ok()) Fail("make_seeds", std::string(model.status().message()));
  PlanExecutor executor(model->get(), true);
  SchedulerOptions so;
  so.chunk_size = testing::kTinyChunkSize;
  so.num_chunks = 24;
  so.max_context = testing::TinyConfig().max_context;
  so.max_batch_size = 8;
  so.max_tokens_per_step = 40;
  so.eos_token_ids = testing::TinyConfig().eos_token_ids;
  auto scheduler = Scheduler::Create(so);
  if (!scheduler.ok()) Fail("make_seeds", std::string(scheduler.status().message()));
  std::mt19937 rng(5);
  std::vector<TokenId> system(40);
  for (TokenId& t : system) t = static_cast<TokenId>(rng() % 90);
  std::vector<std::string> plans;
  for (int step = 0; step < 200; ++step) {
    if (step < 6) {
      RequestSpec spec;
      spec.prompt = system;
      for (int k = 0; k < 3 + step * 5; ++k) spec.prompt.push_back(static_cast<TokenId>(rng() % 90));
      spec.max_new_tokens = 6 + step;
      spec.n = step % 3 == 0 ? 2 : 1;
      spec.sampling.temperature = step % 2 == 0 ? 0.f : 0.8f;
      spec.sampling.top_k = step == 3 ? 5 : 0;
      spec.sampling.repetition_penalty = step == 4 ? 1.3f : 1.f;
      spec.sampling.seed = static_cast<uint64_t>(step);
      spec.cache_namespace = step == 5 ? "tenant" : "";
      if (!(*scheduler)->Add(step + 1, spec).ok()) Fail("make_seeds", "a seed request was refused");
    }
    if (!(*scheduler)->HasWork()) break;
    StepPlan plan;
    auto scheduled = (*scheduler)->Schedule(&plan);
    if (!scheduled.ok()) Fail("make_seeds", std::string(scheduled.status().message()));
    if (!*scheduled) continue;
    internal::v1::StepPlan wire;
    ToProto(plan, &wire);
    plans.push_back(wire.SerializeAsString());
    StepResult result;
    if (absl::Status s = executor.Execute(plan, &result); !s.ok()) Fail("make_seeds", std::string(s.message()));
    std::vector<SampleEvent> events;
    if (absl::Status s = (*scheduler)->Complete(result, &events); !s.ok()) {
      Fail("make_seeds", std::string(s.message()));
    }
  }
  return plans;
}

void PlanSeeds(const std::string& dir) {
  const std::vector<std::string> plans = RecordPlans();
  // From the first step (the context arrives with it), then windows from
  // later steps, whose first plan the executor meets without a context.
  for (size_t n = 1; n <= 8 && n <= plans.size(); ++n) {
    Write(dir, "start-" + std::to_string(n), JoinFrames({plans.begin(), plans.begin() + n}));
  }
  for (size_t begin = 8; begin + 4 <= plans.size(); begin += 6) {
    Write(dir, "window-" + std::to_string(begin), JoinFrames({plans.begin() + begin, plans.begin() + begin + 4}));
  }
  std::printf("plan: %zu plans recorded\n", plans.size());
}

void RequestSeeds(const std::string& dir) {
  std::vector<v1::GenerateRequest> requests(10);
  requests[0].set_text("To be, or not to be, that is the question.");
  requests[1].mutable_token_ids()->add_ids(1);
  for (int id : {5, 17, 42, 3}) requests[1].mutable_token_ids()->add_ids(id);
  requests[2].set_text("Once more unto the breach");
  requests[2].mutable_sampling()->set_temperature(0.7f);
  requests[2].mutable_sampling()->set_top_p(0.9f);
  requests[2].mutable_sampling()->set_top_k(40);
  requests[2].mutable_sampling()->set_seed(7);
  requests[3].set_text("hello world hello");
  requests[3].mutable_sampling()->set_repetition_penalty(1e-38f);  // finding 1's request
  requests[4].set_text("Friends, Romans, countrymen");
  requests[4].mutable_stopping()->set_max_new_tokens(32);
  requests[4].mutable_stopping()->add_stop("\n");
  requests[4].mutable_stopping()->add_stop("lend");
  requests[4].mutable_stopping()->add_stop_token_ids(2);
  requests[4].set_n(4);
  requests[5].set_text("What's in a name?");
  requests[5].set_cache_namespace("tenant-a");
  requests[5].set_request_id("req-5");
  requests[5].set_return_logprobs(true);
  requests[5].set_priority(-3);
  requests[6].set_text(
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd \xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a");
  requests[6].mutable_sampling()->set_min_p(0.1f);
  requests[6].mutable_sampling()->set_temperature(1.5f);
  requests[7].mutable_token_ids()->add_ids(1);
  requests[7].mutable_stopping()->set_max_new_tokens(100000);  // over the context
  requests[8].set_text(std::string(300, 'a'));
  requests[8].mutable_sampling()->set_temperature(0.f);
  requests[9].set_text("ignore eos");
  requests[9].mutable_stopping()->set_ignore_eos(true);
  requests[9].mutable_sampling()->set_repetition_penalty(3.5f);
  for (size_t i = 0; i < requests.size(); ++i) {
    Write(dir, "request-" + std::to_string(i), requests[i].SerializeAsString());
  }
}

// vLLM engine API requests (SMG's form: token ids, proto3 zeros for unset).
void VllmRequestSeeds(const std::string& dir) {
  namespace engine_api = vllm::grpc::engine;
  std::vector<engine_api::GenerateRequest> requests(6);
  for (int id : {1, 5, 17, 42, 3}) requests[0].mutable_tokenized()->add_input_ids(id);
  requests[0].set_request_id("v-0");
  requests[0].mutable_sampling_params()->set_max_tokens(8);
  requests[1].set_text("To be, or not to be");
  requests[1].set_stream(true);
  requests[1].mutable_sampling_params()->set_temperature(0.7f);
  requests[1].mutable_sampling_params()->set_top_p(0.9f);
  requests[1].mutable_sampling_params()->set_top_k(40);
  requests[1].mutable_sampling_params()->set_seed(-7);
  requests[1].mutable_sampling_params()->set_n(3);
  requests[1].mutable_sampling_params()->set_logprobs(5);
  requests[2].mutable_tokenized()->add_input_ids(7);
  requests[2].mutable_sampling_params()->set_max_tokens(4000000000u);  // cut to the context
  requests[2].mutable_sampling_params()->add_stop_token_ids(2);
  requests[2].mutable_sampling_params()->set_min_tokens(3);
  requests[3].mutable_tokenized()->add_input_ids(7);
  requests[3].mutable_sampling_params()->set_json_schema("{}");  // refused
  requests[4].mutable_tokenized()->add_input_ids(4000000000u);  // outside the vocabulary
  requests[5].mutable_tokenized()->add_input_ids(9);
  requests[5].mutable_sampling_params()->set_repetition_penalty(1e-38f);
  requests[5].mutable_sampling_params()->add_stop("\n");
  for (size_t i = 0; i < requests.size(); ++i) {
    Write(dir, "request-" + std::to_string(i), requests[i].SerializeAsString());
  }
}

void SafetensorsSeeds(const std::string& dir) {
  auto tensor = [](const char* name, DType dtype, std::vector<int64_t> shape, int bytes_per) {
    TensorToWrite t;
    t.name = name;
    t.dtype = dtype;
    t.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t.bytes.resize(static_cast<size_t>(n * bytes_per));
    for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    return t;
  };
  const std::string tmp = PrivateDir() + "/seed.safetensors";
  const std::vector<std::vector<TensorToWrite>> files = {
      {tensor("model.embed_tokens.weight", DType::kFloat32, {4, 8}, 4)},
      {tensor("a", DType::kFloat16, {3, 5}, 2), tensor("b", DType::kBFloat16, {7}, 2)},
      {tensor("scalar", DType::kFloat32, {}, 4), tensor("empty", DType::kFloat32, {0, 4}, 4),
       tensor("lm_head.weight", DType::kBFloat16, {2, 2, 2}, 2)},
  };
  for (size_t i = 0; i < files.size(); ++i) {
    const std::map<std::string, std::string> metadata = {{"format", "pt"}};
    if (!WriteSafetensors(tmp, files[i], i == 2 ? metadata : std::map<std::string, std::string>{}).ok()) {
      Fail("make_seeds", "cannot write a safetensors seed");
    }
    absl::StatusOr<std::string> bytes = ReadFileToString(tmp);
    if (!bytes.ok()) Fail("make_seeds", std::string(bytes.status().message()));
    Write(dir + "/safetensors_file", "file-" + std::to_string(i), *bytes);
  }
  const std::string index_dir = dir + "/safetensors_index";
  Write(index_dir, "two-shards", R"({"metadata": {"total_size": 80}, "weight_map": {"a.weight": "a.safetensors",
    "a.bias": "a.safetensors", "b.weight": "b.safetensors", "c.weight": "b.safetensors"}})");
  Write(index_dir, "one-shard", R"({"weight_map": {"a.weight": "a.safetensors"}})");
  Write(index_dir, "missing-tensor", R"({"weight_map": {"missing": "b.safetensors", "b.weight": "b.safetensors"}})");
  Write(index_dir, "outside", R"({"weight_map": {"a.weight": "../a.safetensors", "b.weight": ".."}})");
}

void ForestSeeds(const std::string& dir) {
  std::mt19937 rng(11);
  for (int i = 0; i < 8; ++i) {
    std::string bytes(static_cast<size_t>(64 << (i % 5)), '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    Write(dir, "walk-" + std::to_string(i), bytes);
  }
}

}  // namespace
}  // namespace chunkattn::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: chunkattn-fuzz-seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string root = argv[1];
  chunkattn::fuzz::PlanSeeds(root + "/plan");
  chunkattn::fuzz::RequestSeeds(root + "/generate_request");
  chunkattn::fuzz::VllmRequestSeeds(root + "/vllm_generate_request");
  chunkattn::fuzz::SafetensorsSeeds(root);
  chunkattn::fuzz::ForestSeeds(root + "/prefix_forest");
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
