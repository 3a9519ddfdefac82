// chunkattn.v1's side of the input and output processors: a GenerateRequest
// becomes the coordinator's request field for field, a refusal names the
// field as GenerateRequest does, and an output becomes a GenerateResponse.
#include "services/fronts/grpc/generation_service.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "services/tests/small_model.h"

namespace chunkattn {
namespace {

v1::GenerateRequest Tokens(std::vector<int32_t> ids) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  return r;
}

// The status a request gets, as this front reports it.
absl::Status Refusal(const v1::GenerateRequest& request) {
  absl::StatusOr<ClientRequest> translated = FromProto(request);
  if (!translated.ok()) return translated.status();
  return NameV1Fields(ProcessInput(*translated, testing::SmallModelConfig(), PromptText{}).status());
}

TEST(GenerationServiceTest, FieldsMapToTheCoordinatorsRequest) {
  v1::GenerateRequest r = Tokens({5, 6});
  r.set_request_id("a");
  r.set_cache_namespace("ns");
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_seed(9);
  r.mutable_stopping()->set_max_new_tokens(3);
  r.mutable_stopping()->add_stop("x");
  r.mutable_stopping()->set_min_tokens(1);
  r.set_return_logprobs(true);
  r.set_top_logprobs(2);
  r.set_priority(4);
  absl::StatusOr<ClientRequest> c = FromProto(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->request_id, "a");
  EXPECT_EQ(c->cache_namespace, "ns");
  EXPECT_EQ(std::get<TokenPrompt>(c->prompt).ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(c->sampling.temperature, 0.0f);
  EXPECT_EQ(c->sampling.top_p, 1.0f);  // unset: the default
  EXPECT_EQ(c->sampling.seed, 9u);
  EXPECT_EQ(c->stopping.max_new_tokens, 3);
  EXPECT_EQ(c->stopping.stop, (std::vector<std::string>{"x"}));
  EXPECT_EQ(c->stopping.min_tokens, 1);
  EXPECT_EQ(c->n, 1);  // 0: one sample
  EXPECT_EQ(c->priority, 4);
  EXPECT_TRUE(c->return_logprobs);
  EXPECT_EQ(c->top_logprobs, 2);

  v1::GenerateRequest chat;
  v1::ChatMessage* m = chat.mutable_chat()->add_messages();
  m->set_role("assistant");
  m->set_tool_calls_json("[]");
  chat.mutable_chat()->set_add_generation_prompt(false);
  c = FromProto(chat);
  ASSERT_TRUE(c.ok()) << c.status();
  const ChatPrompt& prompt = std::get<ChatPrompt>(c->prompt);
  ASSERT_EQ(prompt.messages.size(), 1u);
  EXPECT_FALSE(prompt.messages[0].content.has_value());  // unset: null
  EXPECT_EQ(prompt.messages[0].tool_calls_json, "[]");
  EXPECT_FALSE(prompt.add_generation_prompt);
}

TEST(GenerationServiceTest, RefusalsNameTheFieldAsGenerateRequestDoes) {
  std::vector<std::pair<v1::GenerateRequest, std::string>> cases;
  cases.emplace_back(v1::GenerateRequest(), "prompt is empty: set prompt.text");
  cases.emplace_back(Tokens({}), "prompt.token_ids is empty");
  cases.emplace_back(Tokens({1, 100}), "prompt.token_ids[1] = 100 is outside the vocabulary [0, 100)");
  v1::GenerateRequest r = Tokens({1});
  r.set_text("");
  cases.emplace_back(r, "prompt.text is empty");
  r = Tokens({1});
  r.mutable_chat();
  cases.emplace_back(r, "prompt.chat cannot be rendered: the model has no tokenizer");
  r = Tokens({1});
  r.mutable_sampling()->set_top_p(0);
  cases.emplace_back(r, "sampling.top_p must be in (0, 1], got 0");
  r = Tokens({1});
  r.mutable_sampling()->set_temperature(-1);
  cases.emplace_back(r, "sampling.temperature must be >= 0");
  r = Tokens({1});
  r.mutable_stopping()->set_max_new_tokens(0);
  cases.emplace_back(r, "stopping.max_new_tokens must be >= 1");
  r = Tokens({1});
  r.mutable_stopping()->set_max_new_tokens(4000);
  cases.emplace_back(r, "stopping.max_new_tokens (4000) and the prompt (1 tokens) exceed the context of 64 tokens");
  r = Tokens({1});
  r.mutable_stopping()->add_stop_token_ids(-3);
  cases.emplace_back(r, "stopping.stop_token_ids[0] = -3 is outside");
  r = Tokens({1});
  r.mutable_stopping()->set_min_tokens(17);
  cases.emplace_back(r, "stopping.min_tokens = 17 exceeds");
  r = Tokens({1});
  r.mutable_stopping()->add_stop("x");
  cases.emplace_back(r, "stopping.stop cannot be matched");
  r = Tokens({1});
  r.set_n(1000);
  cases.emplace_back(r, "n must be in [1, 64], got 1000");
  r = Tokens({1});
  r.set_priority(2000000);
  cases.emplace_back(r, "priority must be in [-1000000, 1000000]");
  r = Tokens({1});
  r.set_top_logprobs(21);
  r.set_return_logprobs(true);
  cases.emplace_back(r, "top_logprobs must be in [0, 20], got 21");
  r = Tokens({1});
  r.set_top_logprobs(2);
  cases.emplace_back(r, "top_logprobs is set");
  r = Tokens({1});
  r.set_request_id(std::string(300, 'x'));
  cases.emplace_back(r, "request_id is longer than 256 bytes");
  r = Tokens({1});
  r.set_cache_namespace(std::string(300, 'x'));
  cases.emplace_back(r, "cache_namespace is longer than 256 bytes");
  for (const auto& [request, message] : cases) {
    testing::ExpectRefusal(Refusal(request), message);
  }
}

TEST(GenerationServiceTest, OutputsBecomeResponses) {
  GenerationOutput o;
  o.request_id = "a";
  o.index = 1;
  o.token_ids = {7};
  o.text = "hi";
  o.logprobs = {-0.5f};
  o.top_logprobs = {{{7, 8}, {-0.5f, -1.0f}}};
  v1::GenerateResponse r = ToProto(o);
  EXPECT_EQ(r.request_id(), "a");
  EXPECT_EQ(r.index(), 1u);
  EXPECT_EQ(r.text(), "hi");
  EXPECT_EQ(r.top_logprobs(0).token_ids(1), 8);
  EXPECT_FALSE(r.has_usage());  // not the sample's last
  EXPECT_EQ(r.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  o.finish_reason = FinishReason::kStopString;
  o.stop_string = "x";
  o.usage = GenerationOutput::Usage{3, 1, 2};
  r = ToProto(o);
  EXPECT_EQ(r.finish_reason(), v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(r.stop_string(), "x");
  EXPECT_EQ(r.usage().prompt_tokens(), 3u);
  EXPECT_EQ(r.usage().cached_prompt_tokens(), 1u);
  EXPECT_EQ(r.usage().completion_tokens(), 2u);
}

}  // namespace
}  // namespace chunkattn
