#include "services/coordinator/input_processor.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/tenant_namespace.h"

namespace chunkattn {

namespace {

constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr size_t kMaxTextBytes = 4 << 20;
// Text beyond the context's worth of bytes cannot fit: refused before it is
// tokenized (tokenizing costs memory and time in proportion). Prose runs at
// 3-5 bytes per token; 32 leaves room for long pieces and whitespace runs.
constexpr size_t kMaxBytesPerToken = 32;
constexpr int64_t kDefaultMaxNewTokens = 16;
constexpr int kMaxChatMessages = 4096;

absl::Status Invalid(RequestField field, absl::string_view rule) { return InvalidField({field}, rule); }

std::string TooLong(size_t bytes, const ModelConfig& config) {
  return absl::StrFormat("has %d bytes; at most %d fit the context of %d tokens", bytes, MaxTextBytes(config),
                         config.max_context);
}

// The prompt text of a conversation (see TokenizeChatPrompt).
absl::StatusOr<std::string> RenderChatPrompt(const ChatPrompt& chat, const ModelChatTemplate& tmpl,
                                             const ModelConfig& config) {
  if (chat.messages.empty()) return Invalid(RequestField::kChatMessages, "is empty");
  if (chat.messages.size() > static_cast<size_t>(kMaxChatMessages)) {
    return Invalid(RequestField::kChat,
                   absl::StrFormat("has %d messages; at most %d", chat.messages.size(), kMaxChatMessages));
  }
  size_t bytes = chat.tools_json.size() + chat.template_kwargs_json.size();
  for (const ChatMessage& m : chat.messages) {
    bytes += m.role.size() + m.content.value_or("").size() + m.name.size() + m.tool_call_id.size() +
             m.tool_calls_json.size() + m.reasoning_content.value_or("").size();
  }
  if (bytes > MaxTextBytes(config)) return Invalid(RequestField::kChat, TooLong(bytes, config));
  // JSON fields: parsed without exceptions, and of the type the template expects.
  auto parse = [](FieldRef at, const std::string& text, bool array) -> absl::StatusOr<nlohmann::ordered_json> {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return InvalidField(at, "is not valid JSON");
    if (array ? !j.is_array() : !j.is_object()) {
      return InvalidField(at, absl::StrCat("must be a JSON ", array ? "array" : "object"));
    }
    return j;
  };
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < chat.messages.size(); ++i) {
    const ChatMessage& m = chat.messages[i];
    const int index = static_cast<int>(i);
    if (m.role.empty()) return InvalidField({RequestField::kChatMessageRole, index}, "is empty");
    nlohmann::ordered_json message = {{"role", m.role}};
    message["content"] = m.content.has_value() ? nlohmann::ordered_json(*m.content) : nlohmann::ordered_json();
    if (!m.name.empty()) message["name"] = m.name;
    if (!m.tool_call_id.empty()) message["tool_call_id"] = m.tool_call_id;
    if (!m.tool_calls_json.empty()) {
      absl::StatusOr<nlohmann::ordered_json> calls =
          parse({RequestField::kChatToolCalls, index}, m.tool_calls_json, true);
      if (!calls.ok()) return calls.status();
      message["tool_calls"] = std::move(*calls);
    }
    if (m.reasoning_content.has_value()) message["reasoning_content"] = *m.reasoning_content;
    messages.push_back(std::move(message));
  }
  nlohmann::ordered_json tools;
  if (!chat.tools_json.empty()) {
    absl::StatusOr<nlohmann::ordered_json> parsed = parse({RequestField::kChatTools}, chat.tools_json, true);
    if (!parsed.ok()) return parsed.status();
    tools = std::move(*parsed);
  }
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  if (!chat.template_kwargs_json.empty()) {
    absl::StatusOr<nlohmann::ordered_json> parsed =
        parse({RequestField::kChatTemplateKwargs}, chat.template_kwargs_json, false);
    if (!parsed.ok()) return parsed.status();
    kwargs = std::move(*parsed);
  }
  ChatTemplate::Limits limits;
  limits.max_output_bytes = MaxTextBytes(config);
  absl::StatusOr<std::string> text = tmpl.Apply(messages, tools, chat.add_generation_prompt, kwargs, limits);
  if (!text.ok()) {
    return Invalid(RequestField::kChat,
                   absl::StrCat("cannot be rendered: ",
                                ChatTemplate::IsRaisedByTemplate(text.status()) ? "the chat template refused it: " : "",
                                text.status().message()));
  }
  if (text->empty()) return Invalid(RequestField::kChat, "renders to an empty prompt");
  return text;
}

// The sampler's rules (CheckSamplingParams), with the field named ours.
RequestField SamplingField(SamplingParamsError::Field field) {
  switch (field) {
    case SamplingParamsError::Field::kTemperature:
      return RequestField::kTemperature;
    case SamplingParamsError::Field::kTopK:
      return RequestField::kTopK;
    case SamplingParamsError::Field::kTopP:
      return RequestField::kTopP;
    case SamplingParamsError::Field::kMinP:
      return RequestField::kMinP;
    case SamplingParamsError::Field::kRepetitionPenalty:
      return RequestField::kRepetitionPenalty;
    case SamplingParamsError::Field::kTopLogprobs:
      break;
  }
  return RequestField::kTopLogprobs;
}

}  // namespace

uint64_t NewRequestSeed() {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  return counter.fetch_add(0x9E3779B97F4A7C15ull);
}

size_t MaxTextBytes(const ModelConfig& config) {
  return std::min(kMaxTextBytes, static_cast<size_t>(std::max<int64_t>(config.max_context, 1)) * kMaxBytesPerToken);
}

absl::Status CheckTextFits(absl::string_view text, const ModelConfig& config) {
  if (text.size() <= MaxTextBytes(config)) return absl::OkStatus();
  return Invalid(RequestField::kPromptText, TooLong(text.size(), config));
}

absl::StatusOr<PromptTokens> TokenizeChatPrompt(const ChatPrompt& chat, const PromptText& text,
                                                const ModelConfig& config) {
  if (text.tokenizer == nullptr) {
    return Invalid(RequestField::kChat, "cannot be rendered: the model has no tokenizer; send token ids");
  }
  if (text.chat == nullptr) {
    return Invalid(RequestField::kChat, absl::StrCat("cannot be rendered: the model has no usable chat template (",
                                                     text.chat_missing, "); send text or token ids instead"));
  }
  PromptTokens out;
  absl::StatusOr<std::string> rendered = RenderChatPrompt(chat, *text.chat, config);
  if (!rendered.ok()) return rendered.status();
  out.text = *std::move(rendered);
  // As apply_chat_template(tokenize=True): the template wrote the special tokens.
  absl::StatusOr<std::vector<int32_t>> ids = text.tokenizer->Encode(out.text, /*add_bos=*/false);
  if (!ids.ok()) return Invalid(RequestField::kChat, absl::StrCat("cannot be tokenized: ", ids.status().message()));
  out.ids = *std::move(ids);
  return out;
}

absl::StatusOr<EngineRequest> ProcessInput(const ClientRequest& request, const ModelConfig& config,
                                           const PromptText& text) {
  const Tokenizer* tokenizer = text.tokenizer;
  EngineRequest out;
  if (request.request_id.size() > kMaxIdBytes) {
    return Invalid(RequestField::kRequestId, absl::StrFormat("is longer than %d bytes", kMaxIdBytes));
  }
  out.request_id = request.request_id;
  out.owner = request.owner;
  // Checked as sent, then scoped to the tenant.
  if (request.cache_namespace.size() > kMaxIdBytes) {
    return Invalid(RequestField::kCacheNamespace, absl::StrFormat("is longer than %d bytes", kMaxIdBytes));
  }
  RequestSpec& spec = out.spec;
  spec.cache_namespace = CacheNamespace(request.owner, request.cache_namespace);
  const int vocab = config.vocab_size;
  if (const auto* prompt = std::get_if<TextPrompt>(&request.prompt)) {
    if (prompt->text.empty()) return Invalid(RequestField::kPromptText, "is empty");
    if (absl::Status fits = CheckTextFits(prompt->text, config); !fits.ok()) return fits;
    if (tokenizer == nullptr) {
      return Invalid(RequestField::kPromptText, "cannot be tokenized: the model has no tokenizer; send token ids");
    }
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(prompt->text, tokenizer->bos_id() >= 0);
    if (!ids.ok()) {
      return Invalid(RequestField::kPromptText, absl::StrCat("cannot be tokenized: ", ids.status().message()));
    }
    spec.prompt = std::move(*ids);
  } else if (const auto* chat = std::get_if<ChatPrompt>(&request.prompt)) {
    absl::StatusOr<PromptTokens> tokens = TokenizeChatPrompt(*chat, text, config);
    if (!tokens.ok()) return tokens.status();
    spec.prompt = std::move(tokens->ids);
  } else {
    const std::vector<int32_t>& ids = std::get<TokenPrompt>(request.prompt).ids;
    if (ids.empty()) return Invalid(RequestField::kPromptTokenIds, "is empty");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        return InvalidField({RequestField::kPromptTokenIds, static_cast<int>(i)},
                            absl::StrFormat("= %d is outside the vocabulary [0, %d)", ids[i], vocab));
      }
    }
    spec.prompt = ids;
  }
  if (spec.prompt.empty()) return Invalid(RequestField::kPrompt, "is empty after tokenization");

  const ClientRequest::Sampling& s = request.sampling;
  SamplingParams& p = spec.sampling;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.min_p = s.min_p;
  p.repetition_penalty = s.repetition_penalty;
  p.seed = s.seed.has_value() ? *s.seed : NewRequestSeed();
  p.return_logprobs = request.return_logprobs;
  if (request.top_logprobs < 0 || request.top_logprobs > kMaxTopLogprobs) {
    return Invalid(RequestField::kTopLogprobs,
                   absl::StrFormat("must be in [0, %d], got %d", kMaxTopLogprobs, request.top_logprobs));
  }
  if (request.top_logprobs > 0 && !request.return_logprobs) {
    return Invalid(RequestField::kTopLogprobs, "is set, but log probabilities are not asked for");
  }
  // The sampler gives min(N, vocab) entries; the scheduler expects N.
  p.top_logprobs = std::min(static_cast<int32_t>(request.top_logprobs), vocab);
  if (std::optional<SamplingParamsError> bad = CheckSamplingParams(p); bad.has_value()) {
    return Invalid(SamplingField(bad->field), bad->rule);
  }

  const ClientRequest::Stopping& stop = request.stopping;
  const int64_t prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  const int64_t rest_of_context = std::max<int64_t>(1, config.max_context - prompt_tokens);
  int64_t max_new = stop.max_new_tokens.has_value() ? *stop.max_new_tokens
                    : stop.fill_context             ? rest_of_context
                                                    : kDefaultMaxNewTokens;
  if (stop.cap_to_context) max_new = std::min(max_new, rest_of_context);
  if (max_new < 1) return Invalid(RequestField::kMaxNewTokens, "must be >= 1");
  if (max_new > config.max_context - prompt_tokens) {
    return Invalid(RequestField::kMaxNewTokens,
                   absl::StrFormat("(%d) and the prompt (%d tokens) exceed the context of %d tokens", max_new,
                                   prompt_tokens, config.max_context));
  }
  spec.max_new_tokens = static_cast<int32_t>(max_new);
  for (size_t i = 0; i < stop.stop_token_ids.size(); ++i) {
    const int32_t t = stop.stop_token_ids[i];
    if (t < 0 || t >= vocab) {
      return InvalidField({RequestField::kStopTokenIds, static_cast<int>(i)},
                          absl::StrFormat("= %d is outside the vocabulary [0, %d)", t, vocab));
    }
  }
  spec.stop_token_ids = stop.stop_token_ids;
  if (stop.stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    return Invalid(RequestField::kStop, absl::StrFormat("has %d strings; at most %d", stop.stop.size(), kMaxStopStrings));
  }
  for (size_t i = 0; i < stop.stop.size(); ++i) {
    if (stop.stop[i].empty() || stop.stop[i].size() > kMaxStopBytes) {
      return InvalidField({RequestField::kStop, static_cast<int>(i)},
                          absl::StrFormat("must have 1 to %d bytes", kMaxStopBytes));
    }
  }
  if (!stop.stop.empty() && tokenizer == nullptr) {
    return Invalid(RequestField::kStop, "cannot be matched: the model has no tokenizer to produce text");
  }
  out.stop_strings = stop.stop;
  spec.ignore_eos = stop.ignore_eos;
  if (stop.min_tokens < 0) {
    return Invalid(RequestField::kMinTokens, absl::StrFormat("must be >= 0, got %d", stop.min_tokens));
  }
  if (stop.min_tokens > max_new) {
    return Invalid(RequestField::kMinTokens,
                   absl::StrFormat("= %d exceeds the limit of %d new tokens", stop.min_tokens, max_new));
  }
  spec.min_tokens = static_cast<int32_t>(stop.min_tokens);
  if (spec.min_tokens > 0) {
    // The worker masks these until min_tokens: some token must remain.
    std::vector<int32_t> suppressed = StopTokens(spec, config.eos_token_ids);
    std::sort(suppressed.begin(), suppressed.end());
    suppressed.erase(std::unique(suppressed.begin(), suppressed.end()), suppressed.end());
    if (static_cast<int64_t>(suppressed.size()) >= vocab) {
      return Invalid(RequestField::kMinTokens, "cannot be met: the stop and EOS tokens cover the whole vocabulary");
    }
  }
  if (request.n < 1 || request.n > kMaxSamples) {
    return Invalid(RequestField::kN, absl::StrFormat("must be in [1, %d], got %d", kMaxSamples, request.n));
  }
  spec.n = static_cast<int32_t>(request.n);
  if (request.priority < kMinPriority || request.priority > kMaxPriority) {
    return Invalid(RequestField::kPriority,
                   absl::StrFormat("must be in [%d, %d], got %d", kMinPriority, kMaxPriority, request.priority));
  }
  spec.priority = request.priority;
  if (request.constraint.has_value()) {
    if (request.constraint->text.size() > kMaxConstraintBytes) {
      return Invalid(RequestField::kConstraint, absl::StrFormat("has %d bytes; at most %d",
                                                                request.constraint->text.size(), kMaxConstraintBytes));
    }
    if (text.structured == nullptr || text.structured->cache == nullptr) {
      return Invalid(RequestField::kConstraint, "is not supported: the model is served without its tokenizer");
    }
    absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled =
        text.structured->cache->Get(text.structured->vocab, *request.constraint, request.owner);
    if (!compiled.ok()) return Invalid(RequestField::kConstraint, compiled.status().message());
    spec.constraint =
        std::make_shared<GrammarConstraint>(*std::move(compiled), spec.n, request.complete_within_max_tokens);
  } else if (request.complete_within_max_tokens) {
    return Invalid(RequestField::kConstraint, "is required by complete_within_max_tokens");
  }
  if (request.retention.has_value()) {
    absl::StatusOr<RetentionSpec> retention = CheckRetention(*request.retention, spec.prompt.size());
    if (!retention.ok()) return retention.status();
    spec.retention = *retention;
  }
  return out;
}

absl::StatusOr<RetentionSpec> CheckRetention(const ClientRequest::Retention& r, size_t prompt_tokens) {
  RetentionSpec out;
  if (!r.priority.has_value()) return Invalid(RequestField::kRetentionPriority, "is required with retention");
  if (*r.priority < kMinRetentionPriority || *r.priority > kMaxRetentionPriority) {
    return Invalid(RequestField::kRetentionPriority, absl::StrFormat("must be in [%d, %d], got %d",
                                                                     kMinRetentionPriority, kMaxRetentionPriority,
                                                                     *r.priority));
  }
  out.priority = static_cast<int32_t>(*r.priority);
  if (r.duration_ms.has_value()) {
    const int64_t max_ms = absl::ToInt64Milliseconds(kMaxRetentionDuration);
    if (*r.duration_ms < 1 || *r.duration_ms > max_ms) {
      return Invalid(RequestField::kRetentionDurationMs,
                     absl::StrFormat("must be in [1, %d] (30 days), got %d", max_ms, *r.duration_ms));
    }
    out.duration = absl::Milliseconds(*r.duration_ms);
  }
  if (r.token_end.has_value()) {
    if (*r.token_end < 1 || static_cast<uint64_t>(*r.token_end) > prompt_tokens) {
      return Invalid(RequestField::kRetentionTokenEnd,
                     absl::StrFormat("must be in [1, %d] (the prompt's tokens), got %d", prompt_tokens, *r.token_end));
    }
    out.prefix_tokens = static_cast<int32_t>(*r.token_end);
  }
  return out;
}

}  // namespace chunkattn
