// OpenAI's Completions and Chat Completions wire format, and vLLM's extra
// fields, translated to and from the coordinator's terms (ClientRequest,
// GenerationOutput): pure functions and one response builder, no I/O, so
// every rule here is unit-tested.
//
// Errors are absl::Status: INVALID_ARGUMENT naming the OpenAI parameter
// (carried as the status payload kParamPayload, so the HTTP edge can fill
// OpenAI's `error.param`), NOT_FOUND for a model this server does not serve.
// ToApiError turns any status into OpenAI's error body and HTTP status.
#ifndef CHUNKATTN_SERVICES_FRONTS_OPENAI_OPENAI_PROTOCOL_H_
#define CHUNKATTN_SERVICES_FRONTS_OPENAI_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/output_processor.h"
#include "services/coordinator/request.h"
#include "text/tokenizer.h"
#include "text/tool_calls/reasoning_parser.h"
#include "text/tool_calls/tool_parser.h"

namespace chunkattn::openai {

// The status payload that names the offending OpenAI parameter.
inline constexpr char kParamPayload[] = "chunkattn.openai.param";
// Most nesting a request body may have (objects and arrays).
inline constexpr int kMaxJsonDepth = 64;

// INVALID_ARGUMENT with `param` attached.
absl::Status InvalidParam(absl::string_view param, absl::string_view message);

struct ApiError {
  int http_status = 500;
  std::string body;  // {"error": {"message", "type", "param", "code"}}
};
// 400 INVALID_ARGUMENT / OUT_OF_RANGE / FAILED_PRECONDITION (and a request
// that can never fit the KV pool), 401 UNAUTHENTICATED, 403
// PERMISSION_DENIED, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED (a full queue),
// 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, else 500.
ApiError ToApiError(const absl::Status& status);

// The body as JSON: INVALID_ARGUMENT for malformed JSON, nesting deeper than
// kMaxJsonDepth, or a top level that is not an object.
absl::StatusOr<nlohmann::json> ParseBody(absl::string_view body);

// How chat replies' text is read (server-wide: flags, or the model's chat
// template): the model's tool-call format (for tool_choice "auto") and
// whether it thinks in <think> blocks (returned as reasoning_content).
struct OutputFormat {
  tools::ToolCallFormat tool_calls = tools::ToolCallFormat::kNone;
  bool reasoning = false;
  bool starts_in_reasoning = false;  // the template opens <think> in the prompt
};

// What the server serves, for checking and answering requests.
struct ServedModel {
  std::string name;  // the id clients send and /v1/models lists
  int64_t max_context = 0;
  int64_t max_sequences = 256;  // prompts x n in one request (--max_sequences_per_request)
  OutputFormat output;
};

enum class Endpoint { kCompletions, kChat };

// How a chat reply's text becomes tool_calls (tool_choice): not at all, by
// the model's tool-call format (auto), as a constrained JSON array of
// {"name", "parameters"} (required), or as the named function's constrained
// arguments.
enum class ToolMode { kNone, kAuto, kRequired, kNamed };

// A parsed Completions or Chat Completions request.
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // One per prompt (a completions request may carry several; chat has one).
  // cache_namespace holds the client's cache_salt, if any; the server sets
  // request_id and owner.
  std::vector<ClientRequest> prompts;
  uint32_t n = 1;
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  bool echo = false;            // completions: the prompt text leads each choice
  bool logprobs = false;        // report the chosen tokens' logprobs
  uint32_t top_logprobs = 0;    // and the N most likely at each position
  // vLLM's return_token_ids: the prompt's and each choice's token ids beside
  // the text (exact token counts for load tools; token-in/token-out clients).
  bool return_token_ids = false;
  ToolMode tool_mode = ToolMode::kNone;
  std::string tool_name;         // kNamed: the function
  OutputFormat output;           // chat: the served model's
  // The parameter that constrains the output (response_format,
  // structured_outputs.json, guided_regex, tool_choice, ...): where the
  // constraint's refusal points (error.param). Empty: none.
  std::string constraint_param;
};

// The body of POST /v1/completions or /v1/chat/completions.
absl::StatusOr<ApiRequest> ParseCompletionRequest(const nlohmann::json& body, const ServedModel& model);
absl::StatusOr<ApiRequest> ParseChatRequest(const nlohmann::json& body, const ServedModel& model);

// The optional "model" of a body: NOT_FOUND unless it is absent or the
// served name.
absl::Status CheckModel(const nlohmann::json& body, const ServedModel& model);

// The input processor's refusal as this API reports it (any other status as
// it is): its message names the parameter, and so does error.param.
// `prompt` is how the message names the prompt: "prompt", or "prompt[2]"
// for the third of several.
// `constraint_param` names the parameter that carried the constraint
// (ApiRequest::constraint_param).
absl::Status NameOpenAiFields(const absl::Status& status, Endpoint endpoint, absl::string_view prompt = "prompt",
                              absl::string_view constraint_param = "");

// What the reply may repeat of one prompt.
struct PromptEcho {
  std::string text;                // what echo prepends
  std::vector<int32_t> token_ids;  // what return_token_ids reports
};

// Builds one request's reply from the engine's outputs: the streamed Server-
// Sent Events, or the whole JSON body. Not thread-safe (the caller serializes).
class ResponseBuilder {
 public:
  // `prompts`: one per prompt of the request. `tokenizer` (may be null) names
  // tokens in logprobs.
  ResponseBuilder(const ApiRequest& request, std::string id, std::string model, int64_t created,
                  std::vector<PromptEcho> prompts, const Tokenizer* tokenizer);

  // Streaming: the events that open the stream (chat: each choice's role).
  std::string StreamStart();
  // One output of prompt `prompt`: the events to stream, or "" when the
  // reply is not streamed (the output is kept for Body()).
  std::string Add(int prompt, const GenerationOutput& output);
  bool done() const { return finished_ == static_cast<int>(choices_.size()); }
  // Streaming: the usage event (when asked for) and "data: [DONE]".
  std::string StreamEnd();
  // Not streaming: the whole reply.
  std::string Body() const;
  // An error in the middle of a stream, as OpenAI's SDKs expect it.
  static std::string StreamError(const absl::Status& status);

 private:
  struct Choice {
    std::string text;
    std::string finish_reason;
    // Streamed chat: the reply's text read as it comes (OutputFormat, ToolMode).
    std::optional<tools::ReasoningParser> reasoning;
    std::optional<tools::StreamingToolParser> tool_parser;
    bool calls_streamed = false;  // a tool call went out (finish_reason "tool_calls")
    bool named_started = false;   // kNamed: the call's head went out
    nlohmann::json logprobs;         // accumulated (not streaming)
    std::vector<int32_t> token_ids;  // accumulated (not streaming, return_token_ids)
    int64_t text_offset = 0;         // completions logprobs: characters so far
    bool prompt_ids_sent = false;    // streamed completions: prompt_token_ids go once
  };
  nlohmann::json Logprobs(const GenerationOutput& output, Choice& choice) const;
  // Chat: a streamed text piece as a delta (reasoning_content, content,
  // tool_calls); `last` flushes what the parsers hold.
  nlohmann::json ChatDelta(Choice& choice, const std::string& text, bool last);
  // Chat, not streamed: the message for a choice's whole text, and its
  // finish_reason as tools change it.
  nlohmann::json ChatMessage(const Choice& choice, std::string* finish_reason) const;
  // A tool call as OpenAI writes it; `index` >= 0 in a streamed delta.
  static nlohmann::json ToolCallJson(int index, const std::string& id, const std::string& name,
                                     const std::string& arguments);
  nlohmann::json Usage() const;
  // `extra`: more top-level members (chat's prompt_token_ids), or null.
  std::string Event(nlohmann::json choices, bool with_usage_null, nlohmann::json extra = nullptr) const;

  const ApiRequest& request_;
  const std::string id_;
  const std::string model_;
  const int64_t created_;
  const std::vector<PromptEcho> prompts_;
  const Tokenizer* tokenizer_;
  std::vector<Choice> choices_;  // prompt * n + sample
  mutable tools::IdSource ids_;  // tool call ids
  int finished_ = 0;
  // Per prompt: its usage as the last output of any of its samples says.
  std::vector<int64_t> prompt_tokens_, cached_tokens_;
  int64_t completion_tokens_ = 0;
};


}  // namespace chunkattn::openai

#endif  // CHUNKATTN_SERVICES_FRONTS_OPENAI_OPENAI_PROTOCOL_H_
