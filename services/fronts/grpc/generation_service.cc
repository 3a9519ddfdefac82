#include "services/fronts/grpc/generation_service.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_status.h"
#include "services/core/kv_tiers.h"
#include "services/fronts/generate_stream.h"
#include "services/kv_events/kv_events.h"

namespace chunkattn {

namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

ChatPrompt FromProto(const v1::ChatPrompt& chat) {
  ChatPrompt out;
  out.messages.reserve(chat.messages_size());
  for (const v1::ChatMessage& m : chat.messages()) {
    ChatMessage& message = out.messages.emplace_back();
    message.role = m.role();
    if (m.has_content()) message.content = m.content();
    message.name = m.name();
    message.tool_call_id = m.tool_call_id();
    message.tool_calls_json = m.tool_calls_json();
    if (m.has_reasoning_content()) message.reasoning_content = m.reasoning_content();
  }
  out.tools_json = chat.tools_json();
  out.template_kwargs_json = chat.template_kwargs_json();
  out.add_generation_prompt = chat.has_add_generation_prompt() ? chat.add_generation_prompt() : true;
  return out;
}

// A field as GenerateRequest names it.
std::string V1FieldName(FieldRef at) {
  switch (at.field) {
    case RequestField::kRequestId:
      return "request_id";
    case RequestField::kCacheNamespace:
      return "cache_namespace";
    case RequestField::kPrompt:
      return "prompt";
    case RequestField::kPromptText:
      return "prompt.text";
    case RequestField::kPromptTokenIds:
      return WithIndex("prompt.token_ids", at.index);
    case RequestField::kChat:
      return "prompt.chat";
    case RequestField::kChatMessages:
      return "prompt.chat.messages";
    case RequestField::kChatMessageRole:
      return absl::StrCat(WithIndex("prompt.chat.messages", at.index), ".role");
    case RequestField::kChatToolCalls:
      return absl::StrCat(WithIndex("prompt.chat.messages", at.index), ".tool_calls_json");
    case RequestField::kChatTools:
      return "prompt.chat.tools_json";
    case RequestField::kChatTemplateKwargs:
      return "prompt.chat.template_kwargs_json";
    case RequestField::kTemperature:
      return "sampling.temperature";
    case RequestField::kTopK:
      return "sampling.top_k";
    case RequestField::kTopP:
      return "sampling.top_p";
    case RequestField::kMinP:
      return "sampling.min_p";
    case RequestField::kRepetitionPenalty:
      return "sampling.repetition_penalty";
    case RequestField::kMaxNewTokens:
      return "stopping.max_new_tokens";
    case RequestField::kStopTokenIds:
      return WithIndex("stopping.stop_token_ids", at.index);
    case RequestField::kStop:
      return WithIndex("stopping.stop", at.index);
    case RequestField::kMinTokens:
      return "stopping.min_tokens";
    case RequestField::kN:
      return "n";
    case RequestField::kPriority:
      return "priority";
    case RequestField::kTopLogprobs:
      return "top_logprobs";
    case RequestField::kConstraint:
      return "constraint";
    case RequestField::kRetentionPriority:
      return "retention.priority";
    case RequestField::kRetentionDurationMs:
      return "retention.duration_ms";
    case RequestField::kRetentionTokenEnd:
      return "retention.token_end";
  }
  return "request";
}

// The same for TokenizeRequest, whose text and chat are at the top.
absl::Status NameTokenizeFields(const absl::Status& status) {
  return NameErrorField(status,
                        [](FieldRef at) { return std::string(absl::StripPrefix(V1FieldName(at), "prompt.")); });
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStopToken:
      return v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// chunkattn.v1: one message per output.
class V1Translator final : public Translator<v1::GenerateResponse> {
 public:
  void Translate(GenerationOutput output, std::vector<v1::GenerateResponse>* out) override {
    out->push_back(ToProto(output));
  }
};

}  // namespace

absl::StatusOr<ClientRequest> FromProto(const v1::GenerateRequest& request) {
  ClientRequest out;
  out.request_id = request.request_id();
  out.cache_namespace = request.cache_namespace();
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText:
      out.prompt = TextPrompt{request.text()};
      break;
    case v1::GenerateRequest::kTokenIds:
      out.prompt = TokenPrompt{{request.token_ids().ids().begin(), request.token_ids().ids().end()}};
      break;
    case v1::GenerateRequest::kChat:
      out.prompt = FromProto(request.chat());
      break;
    default:
      return Invalid("prompt is empty: set prompt.text, prompt.token_ids or prompt.chat");
  }
  const v1::SamplingParams& s = request.sampling();
  if (s.has_temperature()) out.sampling.temperature = s.temperature();
  if (s.has_top_k()) out.sampling.top_k = s.top_k();
  if (s.has_top_p()) out.sampling.top_p = s.top_p();
  if (s.has_min_p()) out.sampling.min_p = s.min_p();
  if (s.has_repetition_penalty()) out.sampling.repetition_penalty = s.repetition_penalty();
  if (s.has_seed()) out.sampling.seed = s.seed();
  const v1::StoppingCriteria& stop = request.stopping();
  if (stop.has_max_new_tokens()) out.stopping.max_new_tokens = stop.max_new_tokens();
  out.stopping.stop_token_ids.assign(stop.stop_token_ids().begin(), stop.stop_token_ids().end());
  out.stopping.stop.assign(stop.stop().begin(), stop.stop().end());
  out.stopping.ignore_eos = stop.ignore_eos();
  out.stopping.min_tokens = stop.min_tokens();
  if (request.n() != 0) out.n = request.n();  // 0: the default, one sample
  out.priority = request.priority();
  out.return_logprobs = request.return_logprobs();
  out.top_logprobs = request.top_logprobs();
  if (request.has_constraint()) {
    const v1::OutputConstraint& c = request.constraint();
    switch (c.kind_case()) {
      case v1::OutputConstraint::kJsonSchema:
        out.constraint = grammar::Constraint{grammar::ConstraintKind::kJsonSchema, c.json_schema()};
        break;
      case v1::OutputConstraint::kJsonObject:
        if (c.json_object()) out.constraint = grammar::Constraint{grammar::ConstraintKind::kJsonObject, ""};
        break;
      case v1::OutputConstraint::kRegex:
        out.constraint = grammar::Constraint{grammar::ConstraintKind::kRegex, c.regex()};
        break;
      case v1::OutputConstraint::kChoice:
        if (c.choice().choices().empty()) return Invalid("constraint.choice is empty");
        out.constraint = grammar::ChoiceConstraint({c.choice().choices().begin(), c.choice().choices().end()});
        break;
      case v1::OutputConstraint::kGrammar:
        out.constraint = grammar::Constraint{grammar::ConstraintKind::kGrammar, c.grammar()};
        break;
      case v1::OutputConstraint::KIND_NOT_SET:
        return Invalid("constraint is empty: set json_schema, json_object, regex, choice or grammar");
    }
    out.complete_within_max_tokens = c.complete_within_max_tokens();
  }
  if (request.has_retention()) {
    const v1::KvRetention& k = request.retention();
    ClientRequest::Retention& r = out.retention.emplace();
    if (k.has_priority()) r.priority = k.priority();
    if (k.has_duration_ms()) r.duration_ms = k.duration_ms();
    if (k.has_token_end()) r.token_end = k.token_end();
  }
  return out;
}

absl::Status NameV1Fields(const absl::Status& status) { return NameErrorField(status, V1FieldName); }

v1::GenerateResponse ToProto(const GenerationOutput& output) {
  v1::GenerateResponse r;
  r.set_request_id(output.request_id);
  r.set_index(static_cast<uint32_t>(output.index));
  r.mutable_token_ids()->Add(output.token_ids.begin(), output.token_ids.end());
  r.set_text(output.text);
  r.mutable_logprobs()->Add(output.logprobs.begin(), output.logprobs.end());
  for (const GenerationOutput::TopLogprobs& top : output.top_logprobs) {
    v1::TopLogprobs* t = r.add_top_logprobs();
    t->mutable_token_ids()->Add(top.token_ids.begin(), top.token_ids.end());
    t->mutable_logprobs()->Add(top.logprobs.begin(), top.logprobs.end());
  }
  if (output.usage.has_value()) {
    v1::Usage* usage = r.mutable_usage();
    usage->set_prompt_tokens(static_cast<uint32_t>(output.usage->prompt_tokens));
    usage->set_cached_prompt_tokens(static_cast<uint32_t>(output.usage->cached_prompt_tokens));
    usage->set_completion_tokens(static_cast<uint32_t>(output.usage->completion_tokens));
  }
  r.set_finish_reason(ToProto(output.finish_reason));
  r.set_stop_string(output.stop_string);
  return r;
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
  auto* reactor = new GenerateStreamReactor<v1::GenerateResponse>(engine_, std::make_unique<V1Translator>());
  absl::StatusOr<Caller> caller = auth_->Authorize(*context, Permission::kGenerate);
  if (!caller.ok()) {
    reactor->Reject(caller.status());
    return reactor;
  }
  if (!engine_->ready()) {
    reactor->Reject(absl::UnavailableError("the workers are not ready; retry later"));
    return reactor;
  }
  absl::StatusOr<ClientRequest> translated = FromProto(*request);
  if (!translated.ok()) {
    reactor->Reject(translated.status());
    return reactor;
  }
  translated->owner = std::move(caller->tenant);
  reactor->ProcessAndSubmit(*std::move(translated), config_, &text_, text_pool_, NameV1Fields);
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
                                  : NameTokenizeFields(CheckTextFits(request->text(), *config_));
  if (!valid.ok()) {
    reactor->Finish(ToGrpcStatus(valid));
    return reactor;
  }
  auto tokenize = [this, tokenizer, chat, reactor, request, response] {
    absl::StatusOr<PromptTokens> tokens;
    if (chat) {
      tokens = TokenizeChatPrompt(FromProto(request->chat()), text_, *config_);
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
      reactor->Finish(ToGrpcStatus(NameTokenizeFields(tokens.status())));
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
  for (const Engine::TierSnapshot& t : snap.tiers) {
    v1::KvTierStats* o = out->add_tiers();
    o->set_tier(std::string(KvTierName(t.tier)));
    o->set_medium(std::string(KvTierMedium(static_cast<int>(t.tier), "GPU")));
    o->set_blocks(t.blocks);
    o->set_capacity_blocks(t.capacity_blocks);
    o->set_bytes(static_cast<uint64_t>(t.blocks) * static_cast<uint64_t>(snap.chunk_bytes_total));
    o->set_hits_total(t.hits_total);
    o->set_loads_total(t.loads_total);
    o->set_load_seconds_total(t.load_seconds_total);
    o->set_stores_total(t.stores_total);
    o->set_fallbacks_total(t.fallbacks_total);
    o->set_drops_total(t.drops_total);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace chunkattn
