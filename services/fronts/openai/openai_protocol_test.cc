#include "services/fronts/openai/openai_protocol.h"

#include <random>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "services/coordinator/input_processor.h"
#include "services/core/scheduler.h"
#include "services/tests/small_model.h"

namespace chunkattn::openai {
namespace {

using json = nlohmann::json;

const ServedModel kModel{"demo", 2048};

absl::StatusOr<ApiRequest> Completion(const std::string& body) {
  absl::StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  return ParseCompletionRequest(*j, kModel);
}

absl::StatusOr<ApiRequest> Chat(const std::string& body) {
  absl::StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  return ParseChatRequest(*j, kModel);
}

// The OpenAI error body and status a failed parse becomes.
json ErrorOf(const absl::Status& status, int* http_status = nullptr) {
  ApiError e = ToApiError(status);
  if (http_status != nullptr) *http_status = e.http_status;
  return json::parse(e.body)["error"];
}

TEST(ParseBodyTest, RefusesWhatIsNotOneJsonObject) {
  for (const std::string bad : {"", "{", "[1, 2]", "\"text\"", "{\"a\": 1} x", "{\"a\": \"\xff\"}", "nul",
                                "{\"max_tokens\": 1e400}"}) {
    absl::StatusOr<json> j = ParseBody(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(j.status())) << bad;
  }
  EXPECT_TRUE(ParseBody("{\"a\": [1, {\"b\": null}]}").ok());
}

TEST(ParseBodyTest, BoundsNesting) {
  auto nested = [](int depth) {
    return absl::StrCat("{\"a\": ", std::string(depth - 1, '['), std::string(depth - 1, ']'), "}");
  };
  EXPECT_TRUE(ParseBody(nested(kMaxJsonDepth)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ParseBody(nested(kMaxJsonDepth + 1)).status()));
  // Brackets inside strings are text, not nesting.
  EXPECT_TRUE(ParseBody(absl::StrCat("{\"a\": \"", std::string(1000, '['), "\"}")).ok());
  // A million levels fail fast, without recursion.
  EXPECT_TRUE(absl::IsInvalidArgument(ParseBody(std::string(1000000, '[')).status()));
}

TEST(CompletionRequestTest, PromptShapes) {
  absl::StatusOr<ApiRequest> r = Completion(R"({"prompt": "hello"})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(std::get<TextPrompt>(r->prompts[0].prompt).text, "hello");
  EXPECT_EQ(r->prompts[0].stopping.max_new_tokens, 16);  // OpenAI's default

  r = Completion(R"({"prompt": ["a", "b", "c"], "n": 2})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 3u);
  EXPECT_EQ(std::get<TextPrompt>(r->prompts[2].prompt).text, "c");
  EXPECT_EQ(r->prompts[2].n, 2);

  r = Completion(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(std::get<TokenPrompt>(r->prompts[0].prompt).ids.size(), 3u);

  r = Completion(R"({"prompt": [[1, 2], [3]], "model": "demo"})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(std::get<TokenPrompt>(r->prompts[1].prompt).ids[0], 3);

  for (const char* bad : {R"({"prompt": []})", R"({"prompt": [1, "a"]})", R"({"prompt": ["a", [1]]})",
                          R"({"prompt": [[]]})", R"({"prompt": [-1]})", R"({"prompt": 7})", R"({})",
                          R"({"prompt": [1.5]})", R"({"prompt": [99999999999]})"}) {
    absl::StatusOr<ApiRequest> b = Completion(bad);
    ASSERT_TRUE(absl::IsInvalidArgument(b.status())) << bad;
    EXPECT_EQ(ErrorOf(b.status())["param"], "prompt") << bad;
  }
}

TEST(CompletionRequestTest, FieldsMapToOurs) {
  absl::StatusOr<ApiRequest> r = Completion(
      R"({"prompt": "x", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "top_k": -1, "min_p": 0.1,
          "repetition_penalty": 1.2, "seed": -1, "stop": ["a", "b"], "stop_token_ids": [7], "ignore_eos": true,
          "logprobs": 3, "stream": true, "stream_options": {"include_usage": true}, "cache_salt": "s",
          "priority": -5, "user": "u", "presence_penalty": 0, "logit_bias": {}})");
  ASSERT_TRUE(r.ok()) << r.status();
  const ClientRequest& p = r->prompts[0];
  EXPECT_EQ(p.stopping.max_new_tokens, 5);
  EXPECT_EQ(p.sampling.temperature, 0.0f);
  EXPECT_EQ(p.sampling.top_p, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 0);  // vLLM's -1: off
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(p.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(p.stopping.stop.size(), 2u);
  EXPECT_EQ(p.stopping.stop_token_ids[0], 7);
  EXPECT_TRUE(p.stopping.ignore_eos);
  EXPECT_TRUE(p.return_logprobs);
  EXPECT_EQ(p.top_logprobs, 3);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(p.cache_namespace, "s");
  EXPECT_EQ(p.priority, -5);
}

TEST(CompletionRequestTest, BadValuesNameTheirParameter) {
  std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "x", "max_tokens": "16"})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 123456789012345678901234567890})", "max_tokens"},
      {R"({"prompt": "x", "temperature": -1})", "temperature"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "top_p": 0})", "top_p"},
      {R"({"prompt": "x", "n": 0})", "n"},
      {R"({"prompt": "x", "n": 65})", "n"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "x", "echo": true, "logprobs": 1})", "echo"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "x", "stop": 5})", "stop"},
      {R"({"prompt": "x", "stop": ["a", 1]})", "stop"},
      {R"({"prompt": "x", "stop_token_ids": [-1]})", "stop_token_ids"},
      {R"({"prompt": "x", "presence_penalty": 0.5})", "presence_penalty"},
      {R"({"prompt": "x", "logit_bias": {"5": 1}})", "logit_bias"},
      {R"({"prompt": "x", "best_of": 3})", "best_of"},
      {R"({"prompt": "x", "suffix": "end"})", "suffix"},
      {R"({"prompt": "x", "min_tokens": -1})", "min_tokens"},
      {R"({"prompt": "x", "min_tokens": 17})", "min_tokens"},  // over the default max_tokens
      {R"({"prompt": "x", "min_tokens": 40, "max_tokens": 39, "ignore_eos": true})", "min_tokens"},
      {R"({"prompt": "x", "cache_salt": "a", "cache_namespace": "b"})", "cache_salt"},
      {R"({"prompt": "x", "cache_salt": ""})", "cache_salt"},
      {R"({"prompt": "x", "priority": 2000000})", "priority"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "response_format": {"type": "json"}})", "response_format"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}})",
       "response_format"},
      {R"({"prompt": "x", "response_format": "json"})", "response_format"},
      {R"({"prompt": "x", "response_format": {"type": "json_object"}, "guided_regex": "a+"})", "guided_regex"},
      {R"({"prompt": "x", "structured_outputs": {"choice": []}})", "structured_outputs.choice"},
      {R"({"prompt": "x", "structured_outputs": {"choice": ["a", 1]}})", "structured_outputs.choice"},
      {R"({"prompt": "x", "structured_outputs": {"structural_tag": "{}"}})", "structured_outputs.structural_tag"},
      {R"({"prompt": "x", "structured_outputs": {"regex": 5}})", "structured_outputs.regex"},
      {R"({"prompt": "x", "guided_decoding_backend": "xgrammar"})", "guided_decoding_backend"},
  };
  // One small body naming many sequences: prompts x n over the bound (256).
  std::string many = R"({"n": 64, "prompt": [)";
  for (int i = 0; i < 5; ++i) many += i == 0 ? R"("p")" : R"(, "p")";
  cases.push_back({many + "]}", "n"});
  for (const auto& [body, param] : cases) {
    absl::StatusOr<ApiRequest> r = Completion(body);
    ASSERT_FALSE(r.ok()) << body;
    int http = 0;
    const json error = ErrorOf(r.status(), &http);
    EXPECT_EQ(http, 400) << body;
    EXPECT_EQ(error["param"], param) << body << ": " << r.status();
    EXPECT_EQ(error["type"], "invalid_request_error");
  }
  absl::StatusOr<ApiRequest> min = Completion(R"({"prompt": "x", "min_tokens": 4, "stop_token_ids": [9]})");
  ASSERT_TRUE(min.ok()) << min.status();
  EXPECT_EQ(min->prompts[0].stopping.min_tokens, 4);
  EXPECT_FALSE(min->prompts[0].stopping.ignore_eos);
}

// What the input processor refuses, named as OpenAI's parameters: in the
// message and in error.param.
TEST(CompletionRequestTest, ProcessorRefusalsNameTheParameter) {
  const ModelConfig config = testing::SmallModelConfig();
  struct Case {
    std::string body;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"({"prompt": [1, 100]})", "prompt", "'prompt[1]' = 100 is outside the vocabulary [0, 100)"},
      {R"({"prompt": [[1], [1, 2, 100]]})", "prompt", "'prompt[1][2]' = 100 is outside"},
      {R"({"prompt": [1], "max_tokens": 64})", "max_tokens", "'max_tokens' (64) and the prompt (1 tokens) exceed"},
      {R"({"prompt": [1], "stop_token_ids": [5, 100]})", "stop_token_ids", "'stop_token_ids[1]' = 100 is outside"},
      {R"({"prompt": [1], "stop": ["a", ""]})", "stop", "'stop[1]' must have 1 to 256 bytes"},
      {R"({"prompt": [1], "stop": ["a"]})", "stop", "'stop' cannot be matched"},
      {absl::StrCat(R"({"prompt": [1], "cache_salt": ")", std::string(300, 'x'), R"("})"), "cache_salt",
       "'cache_salt' is longer than 256 bytes"},
      {R"({"prompt": "hi"})", "prompt", "'prompt' cannot be tokenized"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ApiRequest> r = Completion(c.body);
    ASSERT_TRUE(r.ok()) << c.body << ": " << r.status();
    const std::string prompt = r->prompts.size() > 1 ? "prompt[1]" : "prompt";
    const ClientRequest& request = r->prompts.back();
    const absl::Status status =
        NameOpenAiFields(ProcessInput(request, config, PromptText{}).status(), Endpoint::kCompletions, prompt);
    const json error = ErrorOf(status);
    EXPECT_EQ(error["param"], c.param) << c.body << ": " << status;
    EXPECT_TRUE(absl::StartsWith(std::string(error["message"]), c.message)) << error["message"] << "\nwanted: "
                                                                           << c.message;
  }
  // Chat: the conversation is `messages`.
  absl::StatusOr<ApiRequest> r = Chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  const json error =
      ErrorOf(NameOpenAiFields(ProcessInput(r->prompts[0], config, PromptText{}).status(), Endpoint::kChat));
  EXPECT_EQ(error["param"], "messages");
  EXPECT_TRUE(absl::StartsWith(std::string(error["message"]), "'messages' cannot be rendered")) << error;
  // Statuses of no field pass as they are.
  EXPECT_EQ(NameOpenAiFields(absl::UnavailableError("x"), Endpoint::kChat), absl::UnavailableError("x"));
}

TEST(CompletionRequestTest, UnknownModelIs404) {
  absl::StatusOr<ApiRequest> r = Completion(R"({"prompt": "x", "model": "gpt-4"})");
  int http = 0;
  const json error = ErrorOf(r.status(), &http);
  EXPECT_EQ(http, 404);
  EXPECT_EQ(error["code"], "model_not_found");
  EXPECT_EQ(error["param"], "model");
}

TEST(ChatRequestTest, MessagesAndTools) {
  absl::StatusOr<ApiRequest> r = Chat(
      R"({"messages": [{"role": "system", "content": "be brief"},
                       {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": null,
                        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                       {"role": "tool", "content": "42", "tool_call_id": "c1"}],
          "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
          "chat_template_kwargs": {"enable_thinking": false}, "add_generation_prompt": true,
          "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->prompts[0].stopping.fill_context);  // no max_tokens: to the end of the context
  const ChatPrompt& chat = std::get<ChatPrompt>(r->prompts[0].prompt);
  ASSERT_EQ(chat.messages.size(), 4u);
  EXPECT_EQ(chat.messages[1].content, "a\nb");
  EXPECT_FALSE(chat.messages[2].content.has_value());
  EXPECT_EQ(json::parse(chat.messages[2].tool_calls_json)[0]["function"]["name"], "f");
  EXPECT_EQ(chat.messages[3].tool_call_id, "c1");
  EXPECT_EQ(json::parse(chat.tools_json)[0]["function"]["name"], "f");
  EXPECT_EQ(json::parse(chat.template_kwargs_json)["enable_thinking"], false);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->prompts[0].top_logprobs, 2);

  r = Chat(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "max_completion_tokens": 7})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->prompts[0].stopping.fill_context);
  EXPECT_EQ(r->prompts[0].stopping.max_new_tokens, 7);  // the newer name wins
}

TEST(ChatRequestTest, BadValuesNameTheirParameter) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({})", "messages"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})",
       "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]})",
       "tools[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
           "tool_choice": {"type": "function", "function": {"name": "g"}}})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
           "tool_choice": "required", "response_format": {"type": "json_object"}})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})", "chat_template_kwargs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})",
       "continue_final_message"},
  };
  for (const auto& [body, param] : cases) {
    absl::StatusOr<ApiRequest> r = Chat(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(ErrorOf(r.status())["param"], param) << body << ": " << r.status();
  }
  EXPECT_TRUE(Chat(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}})").ok());
}

TEST(StructuredOutputsTest, EachFieldSetsItsConstraint) {
  using grammar::ConstraintKind;
  const std::tuple<const char*, ConstraintKind, const char*, const char*> cases[] = {
      {R"("response_format": {"type": "json_object"})", ConstraintKind::kJsonObject, "", "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "object"}}})", ConstraintKind::kJsonSchema, R"({"type":"object"})", "response_format"},
      {R"("structured_outputs": {"json": {"type": "integer"}})", ConstraintKind::kJsonSchema, R"({"type":"integer"})",
       "structured_outputs.json"},
      {R"("structured_outputs": {"regex": "a+", "disable_fallback": true})", ConstraintKind::kRegex, "a+",
       "structured_outputs.regex"},
      {R"("structured_outputs": {"choice": ["yes", "no"]})", ConstraintKind::kChoice, R"(["yes","no"])",
       "structured_outputs.choice"},
      {R"("structured_outputs": {"grammar": "root ::= \"a\""})", ConstraintKind::kGrammar, R"(root ::= "a")",
       "structured_outputs.grammar"},
      {R"("guided_json": "{\"type\": \"string\"}")", ConstraintKind::kJsonSchema, R"({"type": "string"})",
       "guided_json"},
      {R"("guided_choice": ["x"])", ConstraintKind::kChoice, R"(["x"])", "guided_choice"},
  };
  for (const auto& [field, kind, text, param] : cases) {
    for (bool chat : {false, true}) {
      const std::string body = chat ? absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", field, "}")
                                    : absl::StrCat(R"({"prompt": ["a", "b"], )", field, "}");
      absl::StatusOr<ApiRequest> r = chat ? Chat(body) : Completion(body);
      ASSERT_TRUE(r.ok()) << body << ": " << r.status();
      EXPECT_EQ(r->constraint_param, param);
      for (const ClientRequest& p : r->prompts) {
        ASSERT_TRUE(p.constraint.has_value()) << body;
        EXPECT_EQ(p.constraint->kind, kind) << body;
        if (kind != ConstraintKind::kJsonObject) EXPECT_EQ(p.constraint->text, text) << body;
      }
      // A refusal by the compiler names the parameter that carried it.
      const absl::Status named =
          NameOpenAiFields(InvalidField({RequestField::kConstraint}, "has a bad keyword"),
                           chat ? Endpoint::kChat : Endpoint::kCompletions, "prompt", r->constraint_param);
      EXPECT_EQ(ErrorOf(named)["param"], param);
    }
  }
  absl::StatusOr<ApiRequest> none = Chat(R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->prompts[0].constraint.has_value());
  EXPECT_EQ(none->tool_mode, ToolMode::kNone);
}

TEST(StructuredOutputsTest, ToolChoiceModes) {
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_weather",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "now"}}])";
  auto chat = [&](const std::string& choice) {
    return Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", tools, choice, "}"));
  };
  absl::StatusOr<ApiRequest> r = chat("");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tool_mode, ToolMode::kAuto);  // tools without tool_choice: auto
  EXPECT_FALSE(r->prompts[0].constraint.has_value());
  r = chat(R"(, "tool_choice": "none")");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tool_mode, ToolMode::kNone);
  EXPECT_FALSE(std::get<ChatPrompt>(r->prompts[0].prompt).tools_json.empty());  // still rendered
  r = chat(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tool_mode, ToolMode::kNamed);
  EXPECT_EQ(r->tool_name, "get_weather");
  ASSERT_TRUE(r->prompts[0].constraint.has_value());
  EXPECT_EQ(json::parse(r->prompts[0].constraint->text)["required"][0], "city");  // the function's parameters
  r = chat(R"(, "tool_choice": "required")");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tool_mode, ToolMode::kRequired);
  const json schema = json::parse(r->prompts[0].constraint->text);
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["minItems"], 1);
  ASSERT_EQ(schema["items"]["anyOf"].size(), 2u);
  EXPECT_EQ(schema["items"]["anyOf"][1]["properties"]["name"]["const"], "now");
  EXPECT_EQ(schema["items"]["anyOf"][1]["properties"]["parameters"]["type"], "object");
  EXPECT_EQ(r->constraint_param, "tool_choice");
}

TEST(ApiErrorTest, StatusCodes) {
  // The scheduler marks a request that can never fit the pool; the text
  // alone does not make a full queue's 429 a 400.
  absl::Status never = absl::ResourceExhaustedError("the request needs up to 90 KV chunks and the pool holds 8");
  never.SetPayload(kNeverFitsPayload, absl::Cord());
  const std::pair<absl::Status, int> cases[] = {
      {absl::InvalidArgumentError("x"), 400},
      {absl::UnauthenticatedError("x"), 401},
      {absl::NotFoundError("x"), 404},
      {absl::ResourceExhaustedError("the queue is full: 9 requests waiting"), 429},
      {never, 400},
      {absl::ResourceExhaustedError("the request needs up to 90 KV chunks and the pool holds 8"), 429},
      {absl::UnavailableError("x"), 503},
      {absl::InternalError("x"), 500},
  };
  for (const auto& [status, http] : cases) {
    int got = 0;
    const json error = ErrorOf(status, &got);
    EXPECT_EQ(got, http) << status;
    EXPECT_EQ(error["message"], std::string(status.message()));
    EXPECT_TRUE(error.contains("type") && error.contains("param") && error.contains("code"));
  }
}

// The data lines of an SSE text, parsed ("[DONE]" kept as a string).
std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  for (absl::string_view block : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(block, "data: ")) << block;
    block.remove_prefix(6);
    out.push_back(block == "[DONE]" ? json("[DONE]") : json::parse(block));
  }
  return out;
}

GenerationOutput Response(int index, const std::string& text, int token, FinishReason finish = FinishReason::kNone,
                          int prompt_tokens = 0, int cached = 0, int completion = 0) {
  GenerationOutput r;
  r.index = index;
  r.text = text;
  r.token_ids = {token};
  r.logprobs = {-0.5f};
  r.top_logprobs = {{{token, token + 1}, {-0.5f, -1.5f}}};
  if (finish != FinishReason::kNone) {
    r.finish_reason = finish;
    r.usage = GenerationOutput::Usage{prompt_tokens, cached, completion};
  }
  return r;
}

TEST(ResponseBuilderTest, CompletionsBodyOverPromptsAndSamples) {
  absl::StatusOr<ApiRequest> r = Completion(R"({"prompt": ["p", "q"], "n": 2, "echo": true})");
  ASSERT_TRUE(r.ok());
  ResponseBuilder b(*r, "cmpl-1", "demo", 7, {{"P:", {}}, {"Q:", {}}}, nullptr);
  for (int p = 0; p < 2; ++p) {
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(b.Add(p, Response(s, absl::StrCat("t", p, s), 5)), "");
      EXPECT_FALSE(b.done());
      b.Add(p, Response(s, "!", 6, s == 0 ? FinishReason::kLength : FinishReason::kStopString, 10, 4 * p, 2));
    }
  }
  EXPECT_TRUE(b.done());
  const json body = json::parse(b.Body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["id"], "cmpl-1");
  ASSERT_EQ(body["choices"].size(), 4u);
  EXPECT_EQ(body["choices"][3]["index"], 3);
  EXPECT_EQ(body["choices"][3]["text"], "Q:t11!");  // prompt 1, sample 1, echoed
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  // Each prompt once; every sample's completion.
  EXPECT_EQ(body["usage"]["prompt_tokens"], 20);
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);
  EXPECT_EQ(body["usage"]["total_tokens"], 28);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(ResponseBuilderTest, ChatStreamAsOpenAiSendsIt) {
  absl::StatusOr<ApiRequest> r = Chat(
      R"({"messages": [{"role": "user", "content": "x"}], "stream": true, "stream_options": {"include_usage": true},
          "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(r.ok());
  ResponseBuilder b(*r, "chatcmpl-1", "demo", 7, {PromptEcho{}}, nullptr);
  std::string sse = b.StreamStart();
  sse += b.Add(0, Response(0, "Hel", 5));
  sse += b.Add(0, Response(0, "lo", 6, FinishReason::kStopToken, 12, 8, 2));
  ASSERT_TRUE(b.done());
  sse += b.StreamEnd();
  const std::vector<json> events = Events(sse);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(events[0]["usage"].is_null());
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(events[1]["choices"][0]["finish_reason"].is_null());
  const json& lp = events[1]["choices"][0]["logprobs"]["content"][0];
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);
  ASSERT_EQ(lp["top_logprobs"].size(), 2u);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][1]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(events[2]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(events[3]["choices"].empty());
  EXPECT_EQ(events[3]["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  EXPECT_EQ(events[3]["usage"]["total_tokens"], 14);
  EXPECT_EQ(events[4], "[DONE]");
}

// vLLM's return_token_ids: a streamed chunk per token even when the token
// adds no text yet (a partial UTF-8 sequence), prompt ids once per choice.
TEST(ResponseBuilderTest, ReturnTokenIdsInStreamsAndBodies) {
  absl::StatusOr<ApiRequest> stream =
      Completion(R"({"prompt": [[1, 2], [3]], "n": 2, "stream": true, "return_token_ids": true})");
  ASSERT_TRUE(stream.ok());
  EXPECT_TRUE(stream->return_token_ids);
  {
    ResponseBuilder b(*stream, "cmpl-2", "demo", 7, {{"", {1, 2}}, {"", {3}}}, nullptr);
    std::string sse = b.StreamStart();
    EXPECT_EQ(sse, "");
    for (int p = 0; p < 2; ++p) {
      for (int s = 0; s < 2; ++s) {
        sse += b.Add(p, Response(s, "", 40 + s));
        sse += b.Add(p, Response(s, "x", 50 + s, FinishReason::kLength, 2, 0, 2));
      }
    }
    const std::vector<json> events = Events(sse);
    ASSERT_EQ(events.size(), 8u);
    for (int e = 0; e < 8; ++e) {
      const json& c = events[e]["choices"][0];
      const int prompt = e / 4, sample = (e / 2) % 2;
      EXPECT_EQ(c["index"], prompt * 2 + sample);
      EXPECT_EQ(c["token_ids"], json::array({(e % 2 == 0 ? 40 : 50) + sample}));
      EXPECT_EQ(c.contains("prompt_token_ids"), e % 2 == 0) << e;
      if (e % 2 == 0) {
        EXPECT_EQ(c["prompt_token_ids"], prompt == 0 ? json::array({1, 2}) : json::array({3}));
      }
    }
  }
  absl::StatusOr<ApiRequest> body = Completion(R"({"prompt": [1, 2], "return_token_ids": true})");
  ASSERT_TRUE(body.ok());
  {
    ResponseBuilder b(*body, "cmpl-3", "demo", 7, {{"", {1, 2}}}, nullptr);
    b.Add(0, Response(0, "a", 7));
    b.Add(0, Response(0, "", 8, FinishReason::kStopToken, 2, 0, 2));
    const json out = json::parse(b.Body());
    EXPECT_EQ(out["choices"][0]["token_ids"], json({7, 8}));
    EXPECT_EQ(out["choices"][0]["prompt_token_ids"], json({1, 2}));
  }
  absl::StatusOr<ApiRequest> chat = Chat(
      R"({"messages": [{"role": "user", "content": "x"}], "stream": true, "return_token_ids": true})");
  ASSERT_TRUE(chat.ok());
  {
    ResponseBuilder b(*chat, "chatcmpl-2", "demo", 7, {{"", {9, 9, 4}}}, nullptr);
    std::string sse = b.StreamStart();
    sse += b.Add(0, Response(0, "", 11, FinishReason::kStopToken, 3, 0, 1));
    const std::vector<json> events = Events(sse + b.StreamEnd());
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[0]["prompt_token_ids"], json({9, 9, 4}));  // chat: at the top of the first chunk
    EXPECT_EQ(events[1]["choices"][0]["token_ids"], json::array({11}));
    EXPECT_FALSE(events[1].contains("prompt_token_ids"));
  }
  // Not asked: no ids anywhere, and an empty-text token is not streamed.
  absl::StatusOr<ApiRequest> plain = Completion(R"({"prompt": [1], "stream": true})");
  ASSERT_TRUE(plain.ok());
  ResponseBuilder b(*plain, "cmpl-4", "demo", 7, {PromptEcho{}}, nullptr);
  EXPECT_EQ(b.Add(0, Response(0, "", 7)), "");
  EXPECT_FALSE(absl::StrContains(b.Add(0, Response(0, "z", 8)), "token_ids"));
  EXPECT_FALSE(Completion(R"({"prompt": [1], "return_token_ids": 1})").ok());
}

// The calls and text a streamed chat reply adds up to, from its deltas.
struct StreamedChat {
  std::string reasoning, content, finish_reason;
  std::vector<std::tuple<std::string, std::string, std::string>> calls;  // id, name, arguments
};
StreamedChat Collect(const std::vector<json>& events) {
  StreamedChat out;
  for (const json& e : events) {
    if (!e.is_object() || e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    const json& d = c["delta"];
    if (d.contains("reasoning_content")) out.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) out.content += d["content"].get<std::string>();
    for (const json& call : d.value("tool_calls", json::array())) {
      const size_t i = call["index"].get<size_t>();
      if (call.contains("id")) {
        EXPECT_EQ(i, out.calls.size());
        EXPECT_EQ(call["type"], "function");
        out.calls.emplace_back(call["id"], call["function"]["name"], "");
      }
      EXPECT_LT(i, out.calls.size());
      if (i < out.calls.size()) std::get<2>(out.calls[i]) += call["function"]["arguments"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) out.finish_reason = c["finish_reason"];
  }
  return out;
}

const char* kTools = R"("tools": [
    {"type": "function", "function": {"name": "get_weather",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "now"}}])";

// Runs `pieces` through a builder for `body` (streamed and not): the
// streamed deltas collected, and the whole body's first choice.
std::pair<StreamedChat, json> Reply(std::string body, const std::vector<std::string>& pieces, const ServedModel& model,
                                    FinishReason finish = FinishReason::kStopToken) {
  std::pair<StreamedChat, json> out;
  for (bool stream : {true, false}) {
    const std::string b = stream ? absl::StrCat(body.substr(0, body.size() - 1), R"(, "stream": true})") : body;
    absl::StatusOr<json> j = ParseBody(b);
    EXPECT_TRUE(j.ok()) << b;
    absl::StatusOr<ApiRequest> r = ParseChatRequest(*j, model);
    EXPECT_TRUE(r.ok()) << r.status();
    ResponseBuilder builder(*r, "c", "demo", 1, {PromptEcho{}}, nullptr);
    std::string sse = stream ? builder.StreamStart() : "";
    for (size_t i = 0; i < pieces.size(); ++i) {
      GenerationOutput g;
      g.text = pieces[i];
      g.token_ids = {1};
      if (i + 1 == pieces.size()) {
        g.finish_reason = finish;
        g.usage = GenerationOutput::Usage{3, 0, static_cast<int>(pieces.size())};
      }
      sse += builder.Add(0, g);
    }
    if (stream) {
      out.first = Collect(Events(sse + builder.StreamEnd()));
    } else {
      out.second = json::parse(builder.Body())["choices"][0];
    }
  }
  return out;
}

TEST(ToolCallReplyTest, NamedFunctionIsItsArgumentsAndEndsWithStop) {
  const std::string body = absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", kTools,
                                        R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})");
  auto [streamed, whole] = Reply(body, {R"({"city": )", R"("Paris"})"}, kModel);
  ASSERT_EQ(streamed.calls.size(), 1u);
  EXPECT_EQ(std::get<1>(streamed.calls[0]), "get_weather");
  EXPECT_EQ(std::get<2>(streamed.calls[0]), R"({"city": "Paris"})");
  EXPECT_TRUE(absl::StartsWith(std::get<0>(streamed.calls[0]), "call_"));
  EXPECT_EQ(streamed.content, "");
  EXPECT_EQ(streamed.finish_reason, "stop");  // as OpenAI ends a named tool choice
  EXPECT_TRUE(whole["message"]["content"].is_null());
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(whole["finish_reason"], "stop");
}

TEST(ToolCallReplyTest, RequiredIsAnArrayOfCalls) {
  const std::string body =
      absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", kTools, R"(, "tool_choice": "required"})");
  auto [streamed, whole] = Reply(body, {R"([{"name": "now", "parameters": {}}, )",
                                        R"({"name": "get_weather", "parameters": {"city": "Oslo"}}])"}, kModel);
  ASSERT_EQ(streamed.calls.size(), 2u);
  EXPECT_EQ(std::get<1>(streamed.calls[1]), "get_weather");
  EXPECT_EQ(std::get<2>(streamed.calls[1]), R"({"city":"Oslo"})");
  EXPECT_EQ(streamed.finish_reason, "tool_calls");
  ASSERT_EQ(whole["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["name"], "now");
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_NE(whole["message"]["tool_calls"][0]["id"], whole["message"]["tool_calls"][1]["id"]);
  EXPECT_EQ(whole["finish_reason"], "tool_calls");
  // Cut short by max_tokens: no calls, the text as it is, "length".
  auto [cut, cut_whole] = Reply(body, {R"([{"name": "now", "para)"}, kModel, FinishReason::kLength);
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, R"([{"name": "now", "para)");
  EXPECT_EQ(cut_whole["message"]["content"], R"([{"name": "now", "para)");
  EXPECT_EQ(cut_whole["finish_reason"], "length");
}

// tool_choice auto: the model's own format (here Qwen3's <tool_call>
// blocks after its <think> block), streamed in any split as it is whole.
TEST(ToolCallReplyTest, AutoParsesTheModelsFormatAndReasoning) {
  ServedModel model = kModel;
  model.output = {tools::ToolCallFormat::kHermes, /*reasoning=*/true, false};
  const std::string body = absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", kTools, "}");
  const std::string text =
      "<think>The user wants the weather.</think>\n\nLet me check.\n<tool_call>\n"
      R"({"name": "get_weather", "arguments": {"city": "Oslo"}})"
      "\n</tool_call>";
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t n = 1 + rng() % 9;
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    auto [streamed, whole] = Reply(body, pieces, model);
    EXPECT_EQ(whole["message"]["reasoning_content"], "The user wants the weather.");
    ASSERT_EQ(whole["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo"})");
    EXPECT_EQ(whole["finish_reason"], "tool_calls");
    EXPECT_EQ(streamed.reasoning, whole["message"]["reasoning_content"]);
    EXPECT_EQ(streamed.content, whole["message"]["content"].get<std::string>());
    ASSERT_EQ(streamed.calls.size(), 1u);
    EXPECT_EQ(std::get<1>(streamed.calls[0]), "get_weather");
    EXPECT_EQ(std::get<2>(streamed.calls[0]), R"({"city":"Oslo"})");
    EXPECT_EQ(streamed.finish_reason, "tool_calls");
  }
  // No call in the text: plain content, "stop".
  auto [plain, plain_whole] = Reply(body, {"Just ", "text."}, model);
  EXPECT_EQ(plain.content, "Just text.");
  EXPECT_TRUE(plain.calls.empty());
  EXPECT_EQ(plain.finish_reason, "stop");
  EXPECT_FALSE(plain_whole["message"].contains("tool_calls"));
  EXPECT_TRUE(plain_whole["message"]["reasoning_content"].is_null());
}

TEST(ResponseBuilderTest, StreamErrorIsAnErrorEventThenDone) {
  const std::vector<json> events = Events(ResponseBuilder::StreamError(absl::UnavailableError("workers lost")));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["error"]["message"], "workers lost");
  EXPECT_EQ(events[1], "[DONE]");
}

}  // namespace
}  // namespace chunkattn::openai
