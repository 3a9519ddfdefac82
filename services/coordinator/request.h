// A client's generation request in no API's terms. Each front
// (services/fronts/) translates its wire request into a ClientRequest; the
// input processor (input_processor.h) checks and tokenizes it into the
// EngineRequest the engine runs. A refusal names the offending field by
// RequestField, never by an API's name for it: each front names the field in
// its own vocabulary (NameErrorField), so rewording a rule or renaming a wire
// field touches one place.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_REQUEST_H_
#define CHUNKATTN_SERVICES_COORDINATOR_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "text/grammar/compiled_grammar.h"

namespace chunkattn {

// One message of a conversation, as OpenAI's chat API and chat templates
// know it.
struct ChatMessage {
  std::string role;                    // system, user, assistant, tool, ...
  std::optional<std::string> content;  // nullopt: null (an assistant message with only tool calls)
  std::string name;                    // empty: none
  std::string tool_call_id;            // a tool message's answer to this call
  // An assistant message's calls, OpenAI's "tool_calls" as a JSON array;
  // empty: none.
  std::string tool_calls_json;
  std::optional<std::string> reasoning_content;  // a reasoning model's thinking (Qwen3)
};

// A conversation, rendered with the model's chat template exactly as
// transformers' apply_chat_template renders it, then tokenized without
// adding special tokens (the template writes them).
struct ChatPrompt {
  std::vector<ChatMessage> messages;
  std::string tools_json;             // tool definitions (OpenAI function schemas), a JSON array; empty: none
  std::string template_kwargs_json;   // further template variables, a JSON object; empty: none
  bool add_generation_prompt = true;  // end with the assistant's turn header, so the model answers
};

struct TextPrompt {
  std::string text;  // tokenized by the model's tokenizer (BOS added)
};
struct TokenPrompt {
  std::vector<int32_t> ids;  // used as given
};
using Prompt = std::variant<TextPrompt, TokenPrompt, ChatPrompt>;

struct ClientRequest {
  // How tokens are drawn. The defaults leave the model's distribution as it is.
  struct Sampling {
    float temperature = 1.0f;         // >= 0; 0 = greedy
    int32_t top_k = 0;                // >= 0; 0 = off
    float top_p = 1.0f;               // (0, 1]
    float min_p = 0.0f;               // [0, 1]
    float repetition_penalty = 1.0f;  // > 0
    std::optional<uint64_t> seed;     // unset: a fresh one (NewRequestSeed)
  };
  // When a sample ends (besides the model's EOS).
  struct Stopping {
    // >= 1; the prompt and these must fit the context. Unset: 16, or with
    // fill_context up to the end of the context (OpenAI chat, vLLM).
    std::optional<int64_t> max_new_tokens;
    bool fill_context = false;
    // A max_new_tokens past the end of the context is cut to it (vLLM's
    // engine API) rather than refused.
    bool cap_to_context = false;
    std::vector<int32_t> stop_token_ids;
    std::vector<std::string> stop;  // stop strings: the text ends before the earliest match
    bool ignore_eos = false;
    // The first min_tokens tokens are never EOS (unless ignore_eos) nor a
    // stop token, and stop strings are matched only after them; at most
    // max_new_tokens.
    int64_t min_tokens = 0;
  };

  std::string request_id;  // echoed back; what Abort names
  // The caller's tenant (TokenAuth): whose Abort reaches the request, and
  // whose cache namespace it is in ("": no tenants).
  std::string owner;
  // Requests share cached prefixes only within one namespace; this one is
  // scoped to the owner's (base/tenant_namespace.h). Empty: the shared one.
  std::string cache_namespace;
  Prompt prompt;
  Sampling sampling;
  Stopping stopping;
  int64_t n = 1;         // parallel samples of the prompt, [1, kMaxSamples]
  int32_t priority = 0;  // [kMinPriority, kMaxPriority]; lower is admitted first
  bool return_logprobs = false;
  // With return_logprobs: also the N most likely tokens at every generated
  // position, N in [0, kMaxTopLogprobs].
  int64_t top_logprobs = 0;
  // Structured outputs: every sample's text matches this (a JSON schema, any
  // JSON object, a regex, one of a list of strings, a GBNF grammar) and ends
  // as soon as it is complete and nothing more can follow. Unset: free text.
  std::optional<grammar::Constraint> constraint;
  // With a constraint: once the budget (max_new_tokens) is just enough for
  // the shortest completion, the sample writes it, so that its output is
  // complete (parseable) rather than cut off at the budget.
  bool complete_within_max_tokens = false;
  // KV retention (services/core/retention.h), TensorRT-LLM's
  // TokenRangeRetentionConfig for a range that starts at token 0: the
  // prompt's first token_end tokens get `priority` for duration_ms. Unset:
  // none. Checked by the input processor.
  struct Retention {
    std::optional<int64_t> priority;     // required: [0, 100]
    std::optional<int64_t> duration_ms;  // unset: until evicted; else (0, 30 days]
    std::optional<int64_t> token_end;    // unset: the whole prompt; else [1, prompt tokens]
  };
  std::optional<Retention> retention;
};

// The fields a refusal names. Each front maps every one to its own name (a
// switch without a default, so a new field is named everywhere or warned of).
enum class RequestField {
  kRequestId,
  kCacheNamespace,
  kPrompt,  // the prompt whatever its form (empty once tokenized)
  kPromptText,
  kPromptTokenIds,      // indexed
  kChat,                // the conversation as a whole (its size, its rendering)
  kChatMessages,        // the list of messages
  kChatMessageRole,     // indexed by message
  kChatToolCalls,       // indexed by message
  kChatTools,
  kChatTemplateKwargs,
  kTemperature,
  kTopK,
  kTopP,
  kMinP,
  kRepetitionPenalty,
  kMaxNewTokens,
  kStopTokenIds,  // indexed
  kStop,          // indexed
  kMinTokens,
  kN,
  kPriority,
  kTopLogprobs,
  kConstraint,  // the structured-output constraint (whichever wire field carried it)
  kRetentionPriority,
  kRetentionDurationMs,
  kRetentionTokenEnd,
};

// A field, and for an indexed one the element (-1: the field as a whole).
struct FieldRef {
  RequestField field;
  int index = -1;
};

// INVALID_ARGUMENT carrying `at` as its payload, with `rule` as its message:
// what follows the field's name ("is empty", "must be in [1, 64], got 65").
absl::Status InvalidField(FieldRef at, absl::string_view rule);
// The field an InvalidField status names; nullopt for any other status.
std::optional<FieldRef> ErrorField(const absl::Status& status);
// `status` as a front reports it: an InvalidField status's message led by
// `name(field)`, payloads kept; any other status as it is.
absl::Status NameErrorField(const absl::Status& status, absl::FunctionRef<std::string(FieldRef)> name);
// "name[index]", or `name` for a field as a whole: how fronts name elements.
std::string WithIndex(absl::string_view name, int index);

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_REQUEST_H_
