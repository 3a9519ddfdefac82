// The coordinator's input side: checks a ClientRequest (request.h) against
// the model and turns it into the EngineRequest the engine runs: ranges,
// tokenizing text, rendering and tokenizing conversations, fitting the
// context, a seed for a request without one. Every front calls it, so one
// prompt and seed give the same tokens on every API. A refusal is
// InvalidField naming the field by RequestField; the front names it in its
// own terms.
//
// Thread-safe (no state). Text and chat prompts cost time in their length:
// fronts run them on the text pool (text_pool.h), never on a reactor.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_INPUT_PROCESSOR_H_
#define CHUNKATTN_SERVICES_COORDINATOR_INPUT_PROCESSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/model/model_config.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/grammar_constraint.h"
#include "services/coordinator/request.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace chunkattn {

// The longest request id or cache namespace, bytes, and the most ids one
// Abort call names: every front's.
inline constexpr size_t kMaxIdBytes = 256;
inline constexpr int kMaxAbortIds = 1024;
// The longest constraint text (a JSON Schema, a regex, a grammar, a choice
// list's JSON): far past any tool schema, and what bounds the compile
// cache's keys.
inline constexpr size_t kMaxConstraintBytes = 1 << 20;

// A fresh sampling seed (for a request that names none) or id suffix.
uint64_t NewRequestSeed();

// The most bytes a text prompt may have: what could fit the context (and
// never over 4 MiB).
size_t MaxTextBytes(const ModelConfig& config);

// What turns text and conversations into token ids; either may be null
// (then only token ids, or no chat prompts, are accepted).
struct PromptText {
  const Tokenizer* tokenizer = nullptr;
  const ModelChatTemplate* chat = nullptr;
  std::string chat_missing;  // why chat is null, for the error a chat prompt gets
  // Compiles ClientRequest::constraint; null: constraints are refused (a
  // model served without its tokenizer).
  const StructuredOutputs* structured = nullptr;
};

// InvalidField(kPromptText) when `text` could not fit the context: checked
// before text is tokenized (which costs memory and time in its length).
absl::Status CheckTextFits(absl::string_view text, const ModelConfig& config);

// A conversation's prompt text and its ids, as transformers'
// apply_chat_template(tokenize=True) makes them (no special tokens added: the
// template writes them). Sizes are checked before anything is parsed or
// rendered; the template's own raise_exception is refused with its message.
// Refusals name kChat and its parts.
struct PromptTokens {
  std::string text;  // the rendered conversation
  std::vector<int32_t> ids;
};
absl::StatusOr<PromptTokens> TokenizeChatPrompt(const ChatPrompt& chat, const PromptText& text,
                                                const ModelConfig& config);

// A request's retention as the scheduler takes it; refusals name the
// kRetention* fields (a priority off the 0-100 scale, a duration not in
// (0, 30 days], a token_end past the prompt's `prompt_tokens`).
absl::StatusOr<RetentionSpec> CheckRetention(const ClientRequest::Retention& retention, size_t prompt_tokens);

// The checked, tokenized form of `request`, its cache namespace scoped to
// its owner, its constraint compiled (last: the costly check).
absl::StatusOr<EngineRequest> ProcessInput(const ClientRequest& request, const ModelConfig& config,
                                           const PromptText& text);

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_INPUT_PROCESSOR_H_
