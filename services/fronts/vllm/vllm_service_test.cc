// vLLM's engine API's side of the input processor: a GenerateRequest
// becomes the coordinator's request with vLLM's rules, and a refusal names
// the field as vLLM's GenerateRequest does.
#include "services/fronts/vllm/vllm_service.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "services/tests/small_model.h"

namespace chunkattn {
namespace {

namespace engine_api = vllm::grpc::engine;

engine_api::GenerateRequest Tokens(std::vector<uint32_t> ids) {
  engine_api::GenerateRequest r;
  r.mutable_tokenized()->mutable_input_ids()->Add(ids.begin(), ids.end());
  r.mutable_sampling_params()->set_max_tokens(4);
  return r;
}

// The status a request gets, as this front reports it.
absl::Status Refusal(const engine_api::GenerateRequest& request) {
  absl::StatusOr<ClientRequest> translated = TranslateVllmRequest(request);
  if (!translated.ok()) return translated.status();
  return NameVllmFields(ProcessInput(*translated, testing::SmallModelConfig(), PromptText{}).status());
}

TEST(VllmServiceTest, MaxTokensFollowVllm) {
  engine_api::GenerateRequest r = Tokens(std::vector<uint32_t>(60, 1));
  r.mutable_sampling_params()->clear_max_tokens();
  absl::StatusOr<ClientRequest> c = TranslateVllmRequest(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->request_id.empty());  // Abort needs one
  absl::StatusOr<EngineRequest> e = ProcessInput(*c, testing::SmallModelConfig(), PromptText{});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->spec.max_new_tokens, 4);  // unset: to the end of the context
  r.mutable_sampling_params()->set_max_tokens(1000);
  e = ProcessInput(*TranslateVllmRequest(r), testing::SmallModelConfig(), PromptText{});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->spec.max_new_tokens, 4);  // past it: cut to it
}

TEST(VllmServiceTest, RefusalsNameTheFieldAsVllmDoes) {
  std::vector<std::pair<engine_api::GenerateRequest, std::string>> cases;
  cases.emplace_back(Tokens({1, 100}), "tokenized.input_ids[1] = 100 is outside the vocabulary [0, 100)");
  cases.emplace_back(Tokens({1, 0xffffffffu}), "tokenized.input_ids[1] = 4294967295 is outside the vocabulary");
  engine_api::GenerateRequest r = Tokens({1});
  r.mutable_sampling_params()->set_temperature(-1);
  cases.emplace_back(r, "sampling_params.temperature must be >= 0");
  r = Tokens({1});
  r.mutable_sampling_params()->set_top_p(2);
  cases.emplace_back(r, "sampling_params.top_p must be in (0, 1]");
  r = Tokens({1});
  r.mutable_sampling_params()->set_max_tokens(0);
  cases.emplace_back(r, "sampling_params.max_tokens must be >= 1");
  r = Tokens({1});
  r.mutable_sampling_params()->set_min_tokens(9);
  cases.emplace_back(r, "sampling_params.min_tokens = 9 exceeds");
  r = Tokens({1});
  r.mutable_sampling_params()->add_stop_token_ids(100);
  cases.emplace_back(r, "sampling_params.stop_token_ids[0] = 100 is outside");
  r = Tokens({1});
  r.mutable_sampling_params()->add_stop("");
  cases.emplace_back(r, "sampling_params.stop[0] must have 1 to 256 bytes");
  r = Tokens({1});
  r.mutable_sampling_params()->set_n(65);
  cases.emplace_back(r, "sampling_params.n must be in [1, 64], got 65");
  r = Tokens({1});
  r.mutable_sampling_params()->set_logprobs(21);
  cases.emplace_back(r, "sampling_params.logprobs must be in [0, 20], got 21");
  r = Tokens({1});
  r.set_request_id(std::string(300, 'x'));
  cases.emplace_back(r, "request_id is longer than 256 bytes");
  r = Tokens({1});
  r.set_text("hello");
  cases.emplace_back(r, "text cannot be tokenized: the model has no tokenizer");
  for (const auto& [request, message] : cases) {
    testing::ExpectRefusal(Refusal(request), message);
  }
}

}  // namespace
}  // namespace chunkattn
