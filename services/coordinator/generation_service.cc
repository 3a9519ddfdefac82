#include "services/coordinator/generation_service.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_status.h"
#include "services/coordinator/generate_stream.h"

namespace chunkattn {

namespace {

constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr size_t kMaxTextBytes = 4 << 20;
// Text beyond the context's worth of bytes cannot fit: refused before it is
// tokenized (tokenizing costs memory and time in proportion). Prose runs at
// 3-5 bytes per token; 32 leaves room for long pieces and whitespace runs.
constexpr size_t kMaxBytesPerToken = 32;
constexpr int kDefaultMaxNewTokens = 16;
constexpr int kMaxChatMessages = 4096;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

}  // namespace

size_t MaxTextBytes(const ModelConfig& config) {
  return std::min(kMaxTextBytes, static_cast<size_t>(std::max<int64_t>(config.max_context, 1)) * kMaxBytesPerToken);
}

namespace {

// INVALID_ARGUMENT naming `field` when `text` could not fit the context.
absl::Status CheckTextFits(absl::string_view field, absl::string_view text, const ModelConfig& config) {
  if (text.size() <= MaxTextBytes(config)) return absl::OkStatus();
  return Invalid(absl::StrFormat("%s has %d bytes; at most %d fit the context of %d tokens", field, text.size(),
                                 MaxTextBytes(config), config.max_context));
}

}  // namespace

absl::StatusOr<std::string> RenderChatPrompt(const v1::ChatPrompt& chat, const ModelChatTemplate& tmpl,
                                             const ModelConfig& config, absl::string_view field) {
  if (chat.messages_size() == 0) return Invalid(absl::StrCat(field, ".messages is empty"));
  if (chat.messages_size() > kMaxChatMessages) {
    return Invalid(absl::StrFormat("%s has %d messages; at most %d", field, chat.messages_size(), kMaxChatMessages));
  }
  size_t bytes = chat.tools_json().size() + chat.template_kwargs_json().size();
  for (const v1::ChatMessage& m : chat.messages()) {
    bytes += m.role().size() + m.content().size() + m.name().size() + m.tool_call_id().size() +
             m.tool_calls_json().size() + m.reasoning_content().size();
  }
  if (bytes > MaxTextBytes(config)) {
    return Invalid(absl::StrFormat("%s has %d bytes; at most %d fit the context of %d tokens", field, bytes,
                                   MaxTextBytes(config), config.max_context));
  }
  // JSON fields: parsed without exceptions, and of the type the template expects.
  auto parse = [&](const std::string& name, const std::string& text,
                   bool array) -> absl::StatusOr<nlohmann::ordered_json> {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Invalid(absl::StrCat(field, ".", name, " is not valid JSON"));
    if (array ? !j.is_array() : !j.is_object()) {
      return Invalid(absl::StrCat(field, ".", name, " must be a JSON ", array ? "array" : "object"));
    }
    return j;
  };
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    const std::string at = absl::StrFormat("messages[%d]", i);
    if (m.role().empty()) return Invalid(absl::StrCat(field, ".", at, ".role is empty"));
    nlohmann::ordered_json message = {{"role", m.role()}};
    message["content"] = m.has_content() ? nlohmann::ordered_json(m.content()) : nlohmann::ordered_json();
    if (!m.name().empty()) message["name"] = m.name();
    if (!m.tool_call_id().empty()) message["tool_call_id"] = m.tool_call_id();
    if (!m.tool_calls_json().empty()) {
      absl::StatusOr<nlohmann::ordered_json> calls = parse(at + ".tool_calls_json", m.tool_calls_json(), true);
      if (!calls.ok()) return calls.status();
      message["tool_calls"] = std::move(*calls);
    }
    if (m.has_reasoning_content()) message["reasoning_content"] = m.reasoning_content();
    messages.push_back(std::move(message));
  }
  nlohmann::ordered_json tools;
  if (!chat.tools_json().empty()) {
    absl::StatusOr<nlohmann::ordered_json> parsed = parse("tools_json", chat.tools_json(), true);
    if (!parsed.ok()) return parsed.status();
    tools = std::move(*parsed);
  }
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  if (!chat.template_kwargs_json().empty()) {
    absl::StatusOr<nlohmann::ordered_json> parsed = parse("template_kwargs_json", chat.template_kwargs_json(), false);
    if (!parsed.ok()) return parsed.status();
    kwargs = std::move(*parsed);
  }
  ChatTemplate::Limits limits;
  limits.max_output_bytes = MaxTextBytes(config);
  absl::StatusOr<std::string> text =
      tmpl.Apply(messages, tools, chat.has_add_generation_prompt() ? chat.add_generation_prompt() : true, kwargs,
                 limits);
  if (!text.ok()) {
    return Invalid(absl::StrCat(field, ": ",
                                ChatTemplate::IsRaisedByTemplate(text.status()) ? "the chat template refused it: " : "",
                                text.status().message()));
  }
  if (text->empty()) return Invalid(absl::StrCat(field, " renders to an empty prompt"));
  return text;
}

absl::StatusOr<PromptTokens> TokenizeChatPrompt(const v1::ChatPrompt& chat, const PromptText& text,
                                              const ModelConfig& config, absl::string_view field) {
  if (text.tokenizer == nullptr) return Invalid(absl::StrCat(field, ": the model has no tokenizer; send token ids"));
  if (text.chat == nullptr) {
    return Invalid(absl::StrCat(field, ": the model has no usable chat template (", text.chat_missing,
                                "); send text or token ids instead"));
  }
  PromptTokens out;
  absl::StatusOr<std::string> rendered = RenderChatPrompt(chat, *text.chat, config, field);
  if (!rendered.ok()) return rendered.status();
  out.text = *std::move(rendered);
  // As apply_chat_template(tokenize=True): the template wrote the special tokens.
  absl::StatusOr<std::vector<int32_t>> ids = text.tokenizer->Encode(out.text, /*add_bos=*/false);
  if (!ids.ok()) return Invalid(absl::StrCat(field, ": ", ids.status().message()));
  out.ids = *std::move(ids);
  return out;
}

absl::StatusOr<EngineRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                      const ModelConfig& config, const PromptText& text,
                                                      uint64_t seed, bool fill_context, bool cap_to_context) {
  const Tokenizer* tokenizer = text.tokenizer;
  EngineRequest out;
  if (request.request_id().size() > kMaxIdBytes) {
    return Invalid(absl::StrFormat("request_id is longer than %d bytes", kMaxIdBytes));
  }
  out.request_id = request.request_id();
  if (request.cache_namespace().size() > kMaxIdBytes) {
    return Invalid(absl::StrFormat("cache_namespace is longer than %d bytes", kMaxIdBytes));
  }
  RequestSpec& spec = out.spec;
  spec.cache_namespace = request.cache_namespace();
  const int vocab = config.vocab_size;
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return Invalid("prompt.text is empty");
      if (absl::Status fits = CheckTextFits("prompt.text", request.text(), config); !fits.ok()) return fits;
      if (tokenizer == nullptr) {
        return Invalid("prompt.text: the model has no tokenizer; send prompt.token_ids");
      }
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(request.text(), tokenizer->bos_id() >= 0);
      if (!ids.ok()) return Invalid(absl::StrCat("prompt.text: ", ids.status().message()));
      spec.prompt = std::move(*ids);
      break;
    }
    case v1::GenerateRequest::kChat: {
      absl::StatusOr<PromptTokens> chat = TokenizeChatPrompt(request.chat(), text, config, "prompt.chat");
      if (!chat.ok()) return chat.status();
      spec.prompt = std::move(chat->ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return Invalid("prompt.token_ids is empty");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= vocab) {
          return Invalid(absl::StrFormat("prompt.token_ids[%d] = %d is outside the vocabulary [0, %d)", i,
                                         ids[i], vocab));
        }
      }
      spec.prompt.assign(ids.begin(), ids.end());
      break;
    }
    default:
      return Invalid("prompt is empty: set prompt.text, prompt.token_ids or prompt.chat");
  }
  if (spec.prompt.empty()) return Invalid("prompt is empty after tokenization");

  const v1::SamplingParams& s = request.sampling();
  SamplingParams& p = spec.sampling;
  p.temperature = s.has_temperature() ? s.temperature() : 1.0f;
  p.top_k = s.has_top_k() ? s.top_k() : 0;
  p.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  p.min_p = s.has_min_p() ? s.min_p() : 0.0f;
  p.repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f;
  p.seed = s.has_seed() ? s.seed() : seed;
  p.return_logprobs = request.return_logprobs();
  if (request.top_logprobs() > static_cast<uint32_t>(kMaxTopLogprobs)) {
    return Invalid(absl::StrFormat("top_logprobs must be in [0, %d], got %d", kMaxTopLogprobs,
                                   request.top_logprobs()));
  }
  if (request.top_logprobs() > 0 && !request.return_logprobs()) {
    return Invalid("top_logprobs needs return_logprobs");
  }
  // The sampler gives min(N, vocab) entries; the scheduler expects N.
  p.top_logprobs = std::min(static_cast<int32_t>(request.top_logprobs()), vocab);
  // The sampler's own rules, named as the request's fields.
  if (absl::Status valid = ValidateSamplingParams(p); !valid.ok()) {
    return Invalid(absl::StrCat("sampling.", valid.message()));
  }

  const v1::StoppingCriteria& stop = request.stopping();
  const int64_t rest_of_context = std::max<int64_t>(1, config.max_context - static_cast<int64_t>(spec.prompt.size()));
  int64_t max_new = stop.has_max_new_tokens() ? stop.max_new_tokens()
                    : fill_context            ? rest_of_context
                                              : kDefaultMaxNewTokens;
  if (cap_to_context) max_new = std::min(max_new, rest_of_context);
  if (max_new < 1) return Invalid("stopping.max_new_tokens must be >= 1");
  if (static_cast<int64_t>(spec.prompt.size()) + max_new > config.max_context) {
    return Invalid(absl::StrFormat(
        "stopping.max_new_tokens: %d prompt tokens + %d new tokens exceed the context of %d tokens",
        spec.prompt.size(), max_new, config.max_context));
  }
  spec.max_new_tokens = static_cast<int32_t>(max_new);
  for (int i = 0; i < stop.stop_token_ids_size(); ++i) {
    const int32_t t = stop.stop_token_ids(i);
    if (t < 0 || t >= vocab) {
      return Invalid(absl::StrFormat("stopping.stop_token_ids[%d] = %d is outside the vocabulary [0, %d)", i,
                                     t, vocab));
    }
    spec.stop_token_ids.push_back(t);
  }
  if (stop.stop_size() > kMaxStopStrings) {
    return Invalid(absl::StrFormat("stopping.stop has %d strings; at most %d", stop.stop_size(), kMaxStopStrings));
  }
  for (int i = 0; i < stop.stop_size(); ++i) {
    if (stop.stop(i).empty() || stop.stop(i).size() > kMaxStopBytes) {
      return Invalid(absl::StrFormat("stopping.stop[%d] must have 1 to %d bytes", i, kMaxStopBytes));
    }
    out.stop_strings.push_back(stop.stop(i));
  }
  if (!out.stop_strings.empty() && tokenizer == nullptr) {
    return Invalid("stopping.stop: the model has no tokenizer to produce text");
  }
  spec.ignore_eos = stop.ignore_eos();
  if (stop.min_tokens() > static_cast<uint64_t>(spec.max_new_tokens)) {
    return Invalid(absl::StrFormat("stopping.min_tokens = %d exceeds max_new_tokens = %d", stop.min_tokens(),
                                   spec.max_new_tokens));
  }
  spec.min_tokens = static_cast<int32_t>(stop.min_tokens());
  if (spec.min_tokens > 0) {
    // The worker masks these until min_tokens: some token must remain.
    std::vector<int32_t> suppressed = StopTokens(spec, config.eos_token_ids);
    std::sort(suppressed.begin(), suppressed.end());
    suppressed.erase(std::unique(suppressed.begin(), suppressed.end()), suppressed.end());
    if (static_cast<int64_t>(suppressed.size()) >= vocab) {
      return Invalid("stopping.min_tokens: the stop and EOS tokens cover the whole vocabulary");
    }
  }
  if (request.n() > static_cast<uint32_t>(kMaxSamples)) {
    return Invalid(absl::StrFormat("n must be in [1, %d], got %d", kMaxSamples, request.n()));
  }
  spec.n = request.n() == 0 ? 1 : static_cast<int32_t>(request.n());  // 0: the default, one sample
  if (request.priority() < kMinPriority || request.priority() > kMaxPriority) {
    return Invalid(
        absl::StrFormat("priority must be in [%d, %d], got %d", kMinPriority, kMaxPriority, request.priority()));
  }
  spec.priority = request.priority();
  return out;
}

uint64_t NewRequestSeed() {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  return counter.fetch_add(0x9E3779B97F4A7C15ull);
}

GenerationService::GenerationService(Engine* engine, const ModelConfig* config, PromptText text,
                                     ServiceInfo info, const TokenAuth* auth, TextPool* text_pool)
    : engine_(engine),
      config_(config),
      text_(std::move(text)),
      info_(std::move(info)),
      auth_(auth),
      text_pool_(text_pool) {}

GenerationService::~GenerationService() = default;

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(grpc::CallbackServerContext* context,
                                                                            const v1::GenerateRequest* request) {
  auto* reactor = new GenerateStreamReactor<v1::GenerateResponse>(engine_, std::make_unique<IdentityTranslator>());
  absl::StatusOr<Caller> caller = auth_->Authorize(*context, Permission::kGenerate);
  if (!caller.ok()) {
    reactor->Reject(caller.status());
    return reactor;
  }
  if (!engine_->ready()) {
    reactor->Reject(absl::UnavailableError("the workers are not ready; retry later"));
    return reactor;
  }
  const uint64_t seed = NewRequestSeed();
  // The request lives until the reactor finishes, which nothing does before
  // this runs.
  auto validate_and_submit = [this, reactor, request, seed, tenant = std::move(caller->tenant)] {
    absl::StatusOr<EngineRequest> validated = ValidateGenerateRequest(*request, *config_, text_, seed);
    if (!validated.ok()) {
      reactor->Reject(validated.status());
      return;
    }
    validated->spec.cache_namespace = TokenAuth::CacheNamespace(tenant, request->cache_namespace());
    validated->owner = tenant;
    reactor->Submit(std::move(*validated));
  };
  if (request->prompt_case() != v1::GenerateRequest::kText && request->prompt_case() != v1::GenerateRequest::kChat) {
    validate_and_submit();  // token ids: checked in time proportional to what gRPC already parsed
  } else if (!text_pool_->Post(validate_and_submit)) {
    reactor->Reject(absl::ResourceExhaustedError(
        absl::StrFormat("%d text prompts are waiting to be tokenized; retry later", kMaxQueuedTexts)));
  }
  return reactor;
}

bool GenerationService::Denied(const grpc::CallbackServerContext& context, Permission permission,
                       grpc::ServerUnaryReactor* reactor) const {
  absl::StatusOr<Caller> caller = auth_->Authorize(context, permission);
  if (caller.ok()) return false;
  reactor->Finish(ToGrpcStatus(caller.status()));
  return true;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const v1::TokenizeRequest* request,
                                                      v1::TokenizeResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (Denied(*context, Permission::kModelInfo, reactor)) return reactor;
  const Tokenizer* tokenizer = text_.tokenizer;
  if (tokenizer == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the model has no tokenizer"));
    return reactor;
  }
  const bool chat = request->has_chat();
  const absl::Status valid = chat ? (request->text().empty() ? absl::OkStatus() : Invalid("set text or chat, not both"))
                                  : CheckTextFits("text", request->text(), *config_);
  if (!valid.ok()) {
    reactor->Finish(ToGrpcStatus(valid));
    return reactor;
  }
  auto tokenize = [this, tokenizer, chat, reactor, request, response] {
    absl::StatusOr<PromptTokens> tokens;
    if (chat) {
      tokens = TokenizeChatPrompt(request->chat(), text_, *config_, "chat");
    } else {
      const bool add_bos = (request->has_add_bos() ? request->add_bos() : true) && tokenizer->bos_id() >= 0;
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(request->text(), add_bos);
      if (ids.ok()) {
        tokens = PromptTokens{"", *std::move(ids)};
      } else {
        tokens = Invalid(absl::StrCat("text: ", ids.status().message()));
      }
    }
    if (!tokens.ok()) {
      reactor->Finish(ToGrpcStatus(tokens.status()));
      return;
    }
    for (int32_t id : tokens->ids) {
      response->add_token_ids(id);
      absl::StatusOr<std::string> piece = tokenizer->IdToPiece(id);
      response->add_pieces(piece.ok() ? *piece : "");
    }
    response->set_text(std::move(tokens->text));
    reactor->Finish(grpc::Status::OK);
  };
  if (!text_pool_->Post(tokenize)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 absl::StrFormat("%d texts are waiting to be tokenized; retry later", kMaxQueuedTexts)));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*, v1::ModelInfo* info) {
  auto* reactor = context->DefaultReactor();
  if (Denied(*context, Permission::kModelInfo, reactor)) return reactor;
  const Engine::Snapshot snap = engine_->snapshot();
  info->set_model(info_.model);
  info->set_architecture(config_->architecture);
  info->set_dtype(snap.dtype);
  info->set_kv_dtype(snap.kv_dtype.empty() ? info_.kv_dtype : snap.kv_dtype);
  info->set_chunk_size(static_cast<uint32_t>(info_.chunk_size));
  info->set_max_context(static_cast<uint32_t>(config_->max_context));
  info->set_tensor_parallel_size(static_cast<uint32_t>(info_.tensor_parallel_size));
  info->set_kv_capacity_chunks(static_cast<uint64_t>(snap.num_chunks));
  info->set_kv_capacity_tokens(static_cast<uint64_t>(snap.num_chunks) * info_.chunk_size);
  info->set_kv_chunk_bytes(static_cast<uint64_t>(snap.chunk_bytes_total));
  info->set_vocab_size(static_cast<uint32_t>(config_->vocab_size));
  for (int32_t eos : config_->eos_token_ids) info->add_eos_token_ids(eos);
  info->set_prefix_sharing(info_.prefix_sharing);
  info->set_chat_template(text_.chat != nullptr);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* context,
                                                   const v1::AbortRequest* request, v1::AbortResponse* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = auth_->Authorize(*context, Permission::kGenerate);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  if (request->request_ids_size() < 1 || request->request_ids_size() > kMaxAbortIds) {
    reactor->Finish(ToGrpcStatus(Invalid(absl::StrFormat("request_ids must hold 1 to %d ids", kMaxAbortIds))));
    return reactor;
  }
  for (int i = 0; i < request->request_ids_size(); ++i) {
    const std::string& id = request->request_ids(i);
    if (id.empty() || id.size() > kMaxIdBytes) {
      reactor->Finish(
          ToGrpcStatus(Invalid(absl::StrFormat("request_ids[%d] must have 1 to %d bytes", i, kMaxIdBytes))));
      return reactor;
    }
  }
  engine_->Abort(std::move(caller->tenant), {request->request_ids().begin(), request->request_ids().end()},
                 [reactor, response](std::vector<std::string> aborted) {
                   for (std::string& id : aborted) response->add_aborted_request_ids(std::move(id));
                   reactor->Finish(grpc::Status::OK);
                 });
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetKvBlocks(grpc::CallbackServerContext* context,
                                                         const v1::GetKvBlocksRequest* /*request*/,
                                                         v1::KvBlocks* response) {
  auto* reactor = context->DefaultReactor();
  // Block hashes are derived from prompts: a tenant could test whether
  // another's prompt is cached. For routers only.
  if (Denied(*context, Permission::kKvEvents, reactor)) return reactor;
  engine_->KvBlocks([reactor, response](absl::StatusOr<KvBlocksSnapshot> snapshot) {
    if (!snapshot.ok()) {
      reactor->Finish(ToGrpcStatus(snapshot.status()));
      return;
    }
    response->set_next_sequence_number(snapshot->next_seq);
    std::map<std::string, std::vector<uint64_t>> groups;
    for (const KvBlockInfo& b : snapshot->blocks) groups[b.ns].push_back(b.hash);
    for (auto& [ns, hashes] : groups) {
      std::sort(hashes.begin(), hashes.end());
      v1::KvBlockGroup* g = response->add_namespaces();
      g->set_cache_namespace(ns);
      *g->mutable_block_hashes() = {hashes.begin(), hashes.end()};
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetCacheStats(grpc::CallbackServerContext* context,
                                                           const v1::GetCacheStatsRequest* request,
                                                           v1::CacheStats* out) {
  auto* reactor = context->DefaultReactor();
  if (Denied(*context, Permission::kPoolStats, reactor)) return reactor;
  const Engine::Snapshot snap = engine_->snapshot();
  if (request->reset_peaks()) engine_->ResetPeaks();
  const CacheStats& c = snap.cache;
  out->set_capacity_chunks(c.capacity_chunks);
  out->set_used_chunks(c.used_chunks);
  out->set_cached_chunks(c.cached_chunks);
  out->set_free_chunks(c.free_chunks);
  out->set_shared_chunks(c.shared_chunks);
  out->set_logical_tokens(c.logical_tokens);
  out->set_physical_tokens(c.physical_tokens);
  out->set_peak_used_chunks(snap.scheduler.peak_used_chunks);
  out->set_peak_unshared_chunks(snap.scheduler.peak_unshared_chunks);
  out->set_prompt_tokens_total(snap.prompt_tokens_total);
  out->set_cached_prompt_tokens_total(snap.cached_prompt_tokens_total);
  out->set_generation_tokens_total(snap.generation_tokens_total);
  out->set_evicted_chunks_total(c.total_evictions);
  out->set_running_requests(snap.scheduler.running_requests);
  out->set_waiting_requests(snap.scheduler.waiting_requests);
  out->set_preemptions_total(snap.scheduler.preemptions_total);
  out->set_kv_cache_usage(c.kv_usage());
  out->set_waiting_prompt_tokens(snap.scheduler.waiting_prompt_tokens);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace chunkattn
