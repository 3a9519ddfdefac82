#include "services/fronts/vllm/vllm_service.h"

#include <openssl/sha.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/file.h"
#include "base/grpc_status.h"
#include "services/fronts/generate_stream.h"

namespace chunkattn {

namespace engine_api = vllm::grpc::engine;
namespace common_api = smg::grpc::common;

namespace {

constexpr size_t kTokenizerChunkBytes = 64 << 10;  // as vLLM's servicer
// The files of the tokenizer bundle, as SMG's servicer makes it
// (tokenizer_bundle.py): these names, then these suffixes, each file once,
// flat. Those the model folder has are sent.
constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "config.json",     "generation_config.json",
    "special_tokens_map.json", "vocab.json", "merges.txt",       "tokenizer.model",
    "tiktoken.model", "chat_template.json", "preprocessor_config.json",
};
constexpr const char* kTokenizerSuffixes[] = {".tiktoken", ".jinja", ".model"};

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

double UnixSeconds(absl::Time t) { return static_cast<double>(absl::ToUnixMicros(t)) / 1e6; }

// The engine's responses as VllmEngine messages. Streaming: a chunk per
// response with its new tokens, then a complete per sample when it ends.
// Not streaming: one complete per sample with all its tokens. An Abort call
// ends every unfinished sample with finish_reason "abort" and the call OK.
class VllmTranslator final : public Translator<engine_api::GenerateResponse> {
 public:
  VllmTranslator(bool stream, int n, bool logprobs, std::vector<int32_t> stop_token_ids)
      : stream_(stream), logprobs_(logprobs), stop_token_ids_(std::move(stop_token_ids)), samples_(n) {}

  void Translate(GenerationOutput r, std::vector<engine_api::GenerateResponse>* out) override {
    Sample& s = samples_.at(r.index);
    if (r.usage.has_value()) {  // every output carries it (WantsRunningUsage)
      prompt_tokens_ = static_cast<uint32_t>(r.usage->prompt_tokens);
      cached_tokens_ = static_cast<uint32_t>(r.usage->cached_prompt_tokens);
    }
    if (stream_) {
      engine_api::GenerateStreamChunk* chunk = out->emplace_back().mutable_chunk();
      chunk->mutable_token_ids()->Add(r.token_ids.begin(), r.token_ids.end());
      chunk->set_prompt_tokens(prompt_tokens_);
      chunk->set_completion_tokens(static_cast<uint32_t>(r.token_ids.size()));
      chunk->set_cached_tokens(cached_tokens_);
      chunk->set_index(static_cast<uint32_t>(r.index));
      if (logprobs_) AddLogprobs(r, chunk->mutable_output_logprobs());
    } else {
      s.output_ids.insert(s.output_ids.end(), r.token_ids.begin(), r.token_ids.end());
      if (logprobs_) AddLogprobs(r, &s.logprobs);
    }
    if (r.finish_reason == FinishReason::kNone) return;
    s.finished = true;
    // Streaming, the complete repeats the last chunk (as vLLM's servicer);
    // otherwise it carries every token.
    if (stream_) {
      s.output_ids.assign(r.token_ids.begin(), r.token_ids.end());
      if (logprobs_) AddLogprobs(r, &s.logprobs);
    }
    engine_api::GenerateComplete* done =
        Complete(static_cast<uint32_t>(r.index), VllmFinishReason(r.finish_reason), out);
    if (r.finish_reason == FinishReason::kStopToken && !r.token_ids.empty()) {
      // vLLM names the stop token only for stop_token_ids, not for EOS.
      const int32_t last = r.token_ids.back();
      if (std::find(stop_token_ids_.begin(), stop_token_ids_.end(), last) != stop_token_ids_.end()) {
        done->set_matched_token_id(static_cast<uint32_t>(last));
      }
    } else if (r.finish_reason == FinishReason::kStopString && !r.stop_string.empty()) {
      done->set_matched_stop_str(r.stop_string);
    }
  }

  // An Abort call: every unfinished sample ends "abort" (streaming, with no
  // tokens: the chunks carried them) and the call OK, as vLLM's servicer.
  absl::Status Finish(absl::Status status, std::vector<engine_api::GenerateResponse>* out) override {
    if (!IsAbortedByCall(status)) return status;
    for (size_t i = 0; i < samples_.size(); ++i) {
      if (samples_[i].finished) continue;
      if (stream_) {
        samples_[i].output_ids.clear();
        samples_[i].logprobs.Clear();
      }
      Complete(static_cast<uint32_t>(i), "abort", out);
    }
    return absl::OkStatus();
  }

  bool WantsRunningUsage() const override { return true; }

 private:
  struct Sample {
    std::vector<uint32_t> output_ids;  // all (not streaming) or the last chunk's (streaming)
    engine_api::OutputLogProbs logprobs;
    bool finished = false;
  };

  static void AddLogprobs(const GenerationOutput& r, engine_api::OutputLogProbs* out) {
    out->mutable_token_logprobs()->Add(r.logprobs.begin(), r.logprobs.end());
    out->mutable_token_ids()->Add(r.token_ids.begin(), r.token_ids.end());
    for (const GenerationOutput::TopLogprobs& top : r.top_logprobs) {
      engine_api::TopLogProbs* t = out->add_top_logprobs();
      t->mutable_values()->Add(top.logprobs.begin(), top.logprobs.end());
      t->mutable_token_ids()->Add(top.token_ids.begin(), top.token_ids.end());
    }
  }

  engine_api::GenerateComplete* Complete(uint32_t index, const char* reason,
                                         std::vector<engine_api::GenerateResponse>* out) {
    Sample& s = samples_[index];
    engine_api::GenerateComplete* done = out->emplace_back().mutable_complete();
    done->mutable_output_ids()->Add(s.output_ids.begin(), s.output_ids.end());
    if (logprobs_ && !s.output_ids.empty()) *done->mutable_output_logprobs() = s.logprobs;
    done->set_finish_reason(reason);
    done->set_prompt_tokens(prompt_tokens_);
    done->set_completion_tokens(static_cast<uint32_t>(s.output_ids.size()));
    done->set_cached_tokens(cached_tokens_);
    done->set_index(index);
    return done;
  }

  const bool stream_;
  const bool logprobs_;
  const std::vector<int32_t> stop_token_ids_;
  std::vector<Sample> samples_;
  uint32_t prompt_tokens_ = 0;
  uint32_t cached_tokens_ = 0;
};

// Writes a prepared list of messages, then OK.
template <typename Message>
class ListWriter final : public grpc::ServerWriteReactor<Message> {
 public:
  explicit ListWriter(absl::Status error) { this->Finish(ToGrpcStatus(error)); }
  explicit ListWriter(std::vector<Message> messages) : messages_(std::move(messages)) { Next(); }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    ++next_;
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (next_ < messages_.size()) {
      this->StartWrite(&messages_[next_]);
    } else {
      this->Finish(grpc::Status::OK);
    }
  }
  std::vector<Message> messages_;
  size_t next_ = 0;
};

void PutLe(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  std::string hex;
  for (unsigned char c : digest) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  return hex;
}

// A stored block's hash as the proto's int64: the same 64 bits.
int64_t AsInt64(uint64_t hash) { return static_cast<int64_t>(hash); }

common_api::KvEventBatch ToProto(const KvEventBatch& batch) {
  common_api::KvEventBatch out;
  out.set_sequence_number(batch.seq);
  out.set_timestamp(batch.ts);
  out.set_dp_rank(0);
  uint64_t event_id = batch.seq << 20;  // unique while a batch has under 2^20 events
  for (const KvEvent& e : batch.events) {
    common_api::KvCacheEvent* ev = out.add_events();
    ev->set_event_id(event_id++);
    switch (e.kind) {
      case KvEvent::Kind::kBlockStored: {
        common_api::KvBlocksStored* stored = ev->mutable_stored();
        if (e.parent_block_hash.has_value()) stored->set_parent_block_hash(AsInt64(*e.parent_block_hash));
        for (size_t i = 0; i < e.block_hashes.size(); ++i) {
          common_api::KvBlock* b = stored->add_blocks();
          b->set_block_hash(AsInt64(e.block_hashes[i]));
          b->set_block_size(e.block_size);
          // A tier's blocks carry no token ids (kv_events.h): the pool's
          // event of the same hash had them.
          if (e.token_ids.size() >= (i + 1) * e.block_size) {
            const auto first = e.token_ids.begin() + static_cast<ptrdiff_t>(i * e.block_size);
            b->mutable_token_ids()->Add(first, first + e.block_size);
          }
          // The tier below the pool as TensorRT-LLM's cache level (0 the
          // primary, 1 the host, ...); unset for the pool, as before tiers.
          if (e.tier != kKvPoolTier) b->set_cache_level(e.tier);
        }
        break;
      }
      case KvEvent::Kind::kBlockRemoved: {
        common_api::KvBlocksRemoved* removed = ev->mutable_removed();
        for (uint64_t h : e.block_hashes) removed->add_block_hashes(AsInt64(h));
        if (e.tier != kKvPoolTier) removed->set_cache_level(e.tier);
        break;
      }
      case KvEvent::Kind::kAllBlocksCleared:
        ev->mutable_cleared();
        break;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ClientRequest> TranslateVllmRequest(const engine_api::GenerateRequest& request) {
  ClientRequest out;
  // Abort needs an id; SMG always sends one.
  out.request_id = request.request_id().empty() ? absl::StrFormat("chunkattn-%016x", NewRequestSeed())
                                                : request.request_id();
  switch (request.input_case()) {
    case engine_api::GenerateRequest::kTokenized: {
      const auto& ids = request.tokenized().input_ids();
      if (ids.empty()) return Invalid("tokenized.input_ids is empty");
      TokenPrompt prompt;
      for (int i = 0; i < ids.size(); ++i) {
        // Beyond int32, certainly outside the vocabulary: refused naming the id sent.
        if (ids[i] > 0x7fffffffu) {
          return Invalid(absl::StrFormat("tokenized.input_ids[%d] = %u is outside the vocabulary", i, ids[i]));
        }
        prompt.ids.push_back(static_cast<int32_t>(ids[i]));
      }
      out.prompt = std::move(prompt);
      break;
    }
    case engine_api::GenerateRequest::kText:
      if (request.text().empty()) return Invalid("text is empty");
      out.prompt = TextPrompt{request.text()};
      break;
    default:
      return Invalid("input is empty: set tokenized.input_ids or text");
  }
  if (request.has_mm_inputs()) return Invalid("mm_inputs: multimodal inputs are not supported");
  if (request.has_kv_transfer_params() || request.has_kv_transfer_params_json()) {
    return Invalid("kv_transfer_params: KV transfer (disaggregated prefill) is not supported");
  }
  if (request.has_data_parallel_rank() && request.data_parallel_rank() != 0) {
    return Invalid(absl::StrFormat("data_parallel_rank %d: this engine has one rank, 0", request.data_parallel_rank()));
  }
  const engine_api::SamplingParams& s = request.sampling_params();
  switch (s.constraint_case()) {
    case engine_api::SamplingParams::kJsonSchema:
      out.constraint = grammar::Constraint{grammar::ConstraintKind::kJsonSchema, s.json_schema()};
      break;
    case engine_api::SamplingParams::kRegex:
      out.constraint = grammar::Constraint{grammar::ConstraintKind::kRegex, s.regex()};
      break;
    case engine_api::SamplingParams::kGrammar:
      out.constraint = grammar::Constraint{grammar::ConstraintKind::kGrammar, s.grammar()};
      break;
    case engine_api::SamplingParams::kJsonObject:
      if (s.json_object()) out.constraint = grammar::Constraint{grammar::ConstraintKind::kJsonObject, ""};
      break;
    case engine_api::SamplingParams::kChoice:
      out.constraint = grammar::ChoiceConstraint({s.choice().choices().begin(), s.choice().choices().end()});
      break;
    case engine_api::SamplingParams::kStructuralTag:
      return Invalid("sampling_params.structural_tag is not supported (use json_schema, regex, grammar or choice)");
    case engine_api::SamplingParams::CONSTRAINT_NOT_SET:
      break;
  }
  if (s.frequency_penalty() != 0 || s.presence_penalty() != 0) {
    return Invalid("sampling_params: frequency_penalty and presence_penalty are not supported (use repetition_penalty)");
  }
  if (!s.logit_bias().empty()) return Invalid("sampling_params.logit_bias is not supported");
  if (s.has_prompt_logprobs()) return Invalid("sampling_params.prompt_logprobs is not supported");
  if (s.has_truncate_prompt_tokens()) return Invalid("sampling_params.truncate_prompt_tokens is not supported");
  ClientRequest::Sampling& p = out.sampling;
  // proto3 zeros mean "unset" on the plain fields, as in vLLM's servicer.
  if (s.has_temperature()) p.temperature = s.temperature();
  if (s.top_p() != 0) p.top_p = s.top_p();
  if (s.top_k() != 0) p.top_k = static_cast<int32_t>(std::min<uint32_t>(s.top_k(), 0x7fffffff));
  if (s.min_p() != 0) p.min_p = s.min_p();
  if (s.repetition_penalty() != 0) p.repetition_penalty = s.repetition_penalty();
  if (s.has_seed()) p.seed = static_cast<uint64_t>(static_cast<uint32_t>(s.seed()));
  ClientRequest::Stopping& stop = out.stopping;
  if (s.has_max_tokens()) {
    if (s.max_tokens() == 0) return Invalid("sampling_params.max_tokens must be >= 1");
    stop.max_new_tokens = s.max_tokens();
  }
  stop.fill_context = true;    // unset: up to the end of the context
  stop.cap_to_context = true;  // past it: cut to it
  stop.min_tokens = s.min_tokens();
  stop.stop.assign(s.stop().begin(), s.stop().end());
  for (uint32_t t : s.stop_token_ids()) stop.stop_token_ids.push_back(static_cast<int32_t>(std::min<uint32_t>(t, 0x7fffffff)));
  stop.ignore_eos = s.ignore_eos();
  if (s.n() != 0) out.n = s.n();  // 0: the default, one sample
  if (s.has_logprobs()) {
    if (s.logprobs() < 0) return Invalid("sampling_params.logprobs must be >= 0");
    out.return_logprobs = true;
    out.top_logprobs = s.logprobs();
  }
  return out;
}

absl::Status NameVllmFields(const absl::Status& status) {
  return NameErrorField(status, [](FieldRef at) -> std::string {
    switch (at.field) {
      case RequestField::kRequestId:
        return "request_id";
      case RequestField::kPromptTokenIds:
        return WithIndex("tokenized.input_ids", at.index);
      case RequestField::kPromptText:
        return "text";
      case RequestField::kPrompt:
      // No chat and no cache namespace on this API: its input as a whole.
      case RequestField::kCacheNamespace:
      case RequestField::kChat:
      case RequestField::kChatMessages:
      case RequestField::kChatMessageRole:
      case RequestField::kChatToolCalls:
      case RequestField::kChatTools:
      case RequestField::kChatTemplateKwargs:
        return "input";
      case RequestField::kTemperature:
        return "sampling_params.temperature";
      case RequestField::kTopK:
        return "sampling_params.top_k";
      case RequestField::kTopP:
        return "sampling_params.top_p";
      case RequestField::kMinP:
        return "sampling_params.min_p";
      case RequestField::kRepetitionPenalty:
        return "sampling_params.repetition_penalty";
      case RequestField::kMaxNewTokens:
        return "sampling_params.max_tokens";
      case RequestField::kStopTokenIds:
        return WithIndex("sampling_params.stop_token_ids", at.index);
      case RequestField::kStop:
        return WithIndex("sampling_params.stop", at.index);
      case RequestField::kMinTokens:
        return "sampling_params.min_tokens";
      case RequestField::kN:
        return "sampling_params.n";
      case RequestField::kPriority:
        return "priority";
      case RequestField::kTopLogprobs:
        return "sampling_params.logprobs";
      case RequestField::kConstraint:
        return "sampling_params.constraint";
      case RequestField::kRetentionPriority:  // vLLM's API has no retention: never set here
      case RequestField::kRetentionDurationMs:
      case RequestField::kRetentionTokenEnd:
        return "retention";
    }
    return "request";
  });
}

absl::StatusOr<std::string> StoredZip(const std::vector<std::pair<std::string, std::string>>& files) {
  std::string zip, directory;
  for (const auto& [name, data] : files) {
    if (data.size() >= 0xffffffffull || zip.size() >= 0xffffffffull || name.size() > 0xffff) {
      return Invalid("tokenizer files too large for a zip without Zip64");
    }
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    const uint64_t offset = zip.size();
    // Local file header: version 2.0, no flags, stored, no time.
    PutLe(&zip, 0x04034b50, 4);
    PutLe(&zip, 20, 2);
    PutLe(&zip, 0, 2);
    PutLe(&zip, 0, 2);
    PutLe(&zip, 0, 4);
    PutLe(&zip, crc, 4);
    PutLe(&zip, data.size(), 4);
    PutLe(&zip, data.size(), 4);
    PutLe(&zip, name.size(), 2);
    PutLe(&zip, 0, 2);
    zip += name;
    zip += data;
    // Its central directory entry.
    PutLe(&directory, 0x02014b50, 4);
    PutLe(&directory, 20, 2);
    PutLe(&directory, 20, 2);
    PutLe(&directory, 0, 2);
    PutLe(&directory, 0, 2);
    PutLe(&directory, 0, 4);
    PutLe(&directory, crc, 4);
    PutLe(&directory, data.size(), 4);
    PutLe(&directory, data.size(), 4);
    PutLe(&directory, name.size(), 2);
    PutLe(&directory, 0, 2);  // extra
    PutLe(&directory, 0, 2);  // comment
    PutLe(&directory, 0, 2);  // disk
    PutLe(&directory, 0, 2);  // internal attributes
    PutLe(&directory, 0, 4);  // external attributes
    PutLe(&directory, offset, 4);
    directory += name;
  }
  if (zip.size() + directory.size() >= 0xffffffffull || files.size() > 0xffff) {
    return Invalid("tokenizer files too large for a zip without Zip64");
  }
  const uint64_t directory_offset = zip.size();
  zip += directory;
  PutLe(&zip, 0x06054b50, 4);
  PutLe(&zip, 0, 2);
  PutLe(&zip, 0, 2);
  PutLe(&zip, files.size(), 2);
  PutLe(&zip, files.size(), 2);
  PutLe(&zip, directory.size(), 4);
  PutLe(&zip, directory_offset, 4);
  PutLe(&zip, 0, 2);
  return zip;
}

VllmService::VllmService(Engine* engine, const ModelConfig* config, PromptText text,
                                     VllmServiceInfo info, const TokenAuth* auth, TextPool* text_pool,
                                     KvEventPublisher* kv_events)
    : engine_(engine),
      config_(config),
      text_(std::move(text)),
      info_(std::move(info)),
      auth_(auth),
      text_pool_(text_pool),
      kv_events_(kv_events),
      started_(absl::Now()) {}

VllmService::~VllmService() { Shutdown(); }

void VllmService::Shutdown() { stopping_ = true; }

bool VllmService::Denied(const grpc::CallbackServerContext& context, Permission permission,
                       grpc::ServerUnaryReactor* reactor) const {
  absl::StatusOr<Caller> caller = auth_->Authorize(context, permission);
  if (caller.ok()) return false;
  reactor->Finish(ToGrpcStatus(caller.status()));
  return true;
}

grpc::ServerWriteReactor<engine_api::GenerateResponse>* VllmService::Generate(
    grpc::CallbackServerContext* context, const engine_api::GenerateRequest* request) {
  last_receive_ = UnixSeconds(absl::Now());
  const engine_api::SamplingParams& s = request->sampling_params();
  auto* reactor = new GenerateStreamReactor<engine_api::GenerateResponse>(
      engine_, std::make_unique<VllmTranslator>(
                   request->stream(), std::max<int>(1, std::min<int>(s.n(), kMaxSamples)), s.has_logprobs(),
                   std::vector<int32_t>(s.stop_token_ids().begin(), s.stop_token_ids().end())));
  absl::StatusOr<Caller> caller = auth_->Authorize(*context, Permission::kGenerate);
  if (!caller.ok()) {
    reactor->Reject(caller.status());
    return reactor;
  }
  if (!engine_->ready()) {
    reactor->Reject(absl::UnavailableError("the workers are not ready; retry later"));
    return reactor;
  }
  absl::StatusOr<ClientRequest> translated = TranslateVllmRequest(*request);
  if (!translated.ok()) {
    reactor->Reject(translated.status());
    return reactor;
  }
  // This API has no namespace field: the tenant's own.
  translated->owner = std::move(caller->tenant);
  reactor->ProcessAndSubmit(*std::move(translated), config_, &text_, text_pool_, NameVllmFields);
  return reactor;
}

grpc::ServerUnaryReactor* VllmService::HealthCheck(grpc::CallbackServerContext* context,
                                                         const engine_api::HealthCheckRequest* /*request*/,
                                                         engine_api::HealthCheckResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (Denied(*context, Permission::kModelInfo, reactor)) return reactor;
  const bool ready = engine_->ready();
  response->set_healthy(ready);
  response->set_message(ready ? "serving" : "the workers are not ready");
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* VllmService::Abort(grpc::CallbackServerContext* context,
                                                   const engine_api::AbortRequest* request,
                                                   engine_api::AbortResponse* /*response*/) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = auth_->Authorize(*context, Permission::kGenerate);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  if (request->request_ids_size() > kMaxAbortIds) {
    reactor->Finish(ToGrpcStatus(Invalid(absl::StrFormat("request_ids holds over %d ids", kMaxAbortIds))));
    return reactor;
  }
  std::vector<std::string> ids;
  for (const std::string& id : request->request_ids()) {
    if (!id.empty() && id.size() <= kMaxIdBytes) ids.push_back(id);  // others name no request
  }
  if (ids.empty()) {
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  engine_->Abort(std::move(caller->tenant), std::move(ids),
                 [reactor](std::vector<std::string> /*aborted*/) { reactor->Finish(grpc::Status::OK); });
  return reactor;
}

grpc::ServerUnaryReactor* VllmService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const engine_api::GetModelInfoRequest* /*request*/,
                                                          engine_api::GetModelInfoResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (Denied(*context, Permission::kModelInfo, reactor)) return reactor;
  response->set_model_path(info_.model_path);
  response->set_is_generation(true);
  response->set_max_context_length(static_cast<uint32_t>(config_->max_context));
  response->set_vocab_size(static_cast<uint32_t>(config_->vocab_size));
  response->set_supports_vision(false);
  response->set_served_model_name(info_.served_model_name);
  response->set_tokenizer_path(info_.model_path);
  response->set_model_type(config_->model_type);
  if (!config_->architecture.empty()) response->add_architectures(config_->architecture);
  for (int32_t id : config_->eos_token_ids) response->add_eos_token_ids(id);
  response->set_bos_token_id(config_->bos_token_id);
  response->set_pad_token_id(-1);
  response->set_max_req_input_len(static_cast<int32_t>(config_->max_context));
  response->set_default_sampling_params_json("{}");
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* VllmService::GetServerInfo(grpc::CallbackServerContext* context,
                                                           const engine_api::GetServerInfoRequest* /*request*/,
                                                           engine_api::GetServerInfoResponse* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = auth_->Authorize(*context, Permission::kModelInfo);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  // Any credential learns the server's kind; the pool's traffic only a
  // credential that may see pool-wide figures (0 for a tenant).
  if (caller->Allow(Permission::kPoolStats).ok()) {
    const Engine::Snapshot snap = engine_->snapshot();
    response->set_active_requests(
        static_cast<uint32_t>(snap.scheduler.running_requests + snap.scheduler.waiting_requests));
    response->set_last_receive_timestamp(last_receive_.load());
  }
  response->set_is_paused(false);
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  response->set_server_type("vllm-grpc");  // what routers check for this API (design note)
  response->set_data_parallel_size(1);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* VllmService::GetLoads(grpc::CallbackServerContext* context,
                                                      const engine_api::GetLoadsRequest* request,
                                                      engine_api::GetLoadsResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (Denied(*context, Permission::kPoolStats, reactor)) return reactor;
  if (request->has_dp_rank() && request->dp_rank() != 0) {
    reactor->Finish(ToGrpcStatus(Invalid(absl::StrFormat("dp_rank %d: this engine has one rank, 0", request->dp_rank()))));
    return reactor;
  }
  const Engine::Snapshot snap = engine_->snapshot();
  response->set_timestamp(absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()));
  response->set_version(info_.version);
  response->set_dp_rank_count(1);
  engine_api::SchedulerLoad* load = response->add_loads();
  const CacheStats& c = snap.cache;
  load->set_dp_rank(0);
  load->set_num_running_reqs(static_cast<int32_t>(snap.scheduler.running_requests));
  load->set_num_waiting_reqs(static_cast<int32_t>(snap.scheduler.waiting_requests));
  load->set_num_total_reqs(static_cast<int32_t>(snap.scheduler.running_requests + snap.scheduler.waiting_requests));
  load->set_num_used_tokens(static_cast<int32_t>(std::min<int64_t>(c.physical_tokens, INT32_MAX)));
  load->set_max_total_num_tokens(
      static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(c.capacity_chunks) * info_.chunk_size, INT32_MAX)));
  load->set_token_usage(c.kv_usage());
  load->set_cache_hit_rate(snap.prompt_tokens_total > 0 ? static_cast<double>(snap.cached_prompt_tokens_total) /
                                                              static_cast<double>(snap.prompt_tokens_total)
                                                        : 0.0);
  load->set_utilization(load->token_usage());
  load->set_max_running_requests(static_cast<int32_t>(info_.max_running_requests));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<common_api::GetTokenizerChunk>* VllmService::GetTokenizer(
    grpc::CallbackServerContext* context, const common_api::GetTokenizerRequest* /*request*/) {
  using Writer = ListWriter<common_api::GetTokenizerChunk>;
  if (absl::Status s = auth_->Check(*context); !s.ok()) return new Writer(s);
  std::vector<std::string> names(std::begin(kTokenizerFiles), std::end(kTokenizerFiles));
  std::vector<std::string> matched;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(info_.model_path, ec)) {
    const std::string name = entry.path().filename().string();
    for (const char* suffix : kTokenizerSuffixes) {
      if (absl::EndsWith(name, suffix)) matched.push_back(name);
    }
  }
  std::sort(matched.begin(), matched.end());
  names.insert(names.end(), matched.begin(), matched.end());
  std::vector<std::pair<std::string, std::string>> files;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& name : names) {
    const std::filesystem::path path = std::filesystem::path(info_.model_path) / name;
    if (!std::filesystem::is_regular_file(path, ec) || !seen.insert(name).second) continue;
    absl::StatusOr<std::string> data = ReadFileToString(path.string());
    if (!data.ok()) return new Writer(absl::InternalError(absl::StrCat("reading ", name, ": ", data.status().message())));
    files.emplace_back(name, *std::move(data));
  }
  if (files.empty()) return new Writer(absl::FailedPreconditionError("the model folder has no tokenizer files"));
  absl::StatusOr<std::string> zip = StoredZip(files);
  if (!zip.ok()) return new Writer(zip.status());
  std::vector<common_api::GetTokenizerChunk> chunks;
  for (size_t at = 0; at < zip->size(); at += kTokenizerChunkBytes) {
    chunks.emplace_back().set_data(zip->substr(at, kTokenizerChunkBytes));
  }
  chunks.back().set_sha256(Sha256Hex(*zip));
  return new Writer(std::move(chunks));
}

// One SubscribeKvEvents call: its thread waits for the publisher's batches
// and writes them one at a time, until the client leaves or the service
// shuts down. Deleted in OnDone, after its thread has ended.
class VllmService::Subscription final : public grpc::ServerWriteReactor<common_api::KvEventBatch> {
 public:
  Subscription(VllmService* service, uint64_t from) : service_(service), next_(from) {
    StartSendInitialMetadata();  // the subscriber knows it is registered before any batch
    thread_ = std::thread([this] { Run(); });
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) broken_ = true;
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    broken_ = true;
  }
  void OnDone() override {
    // Finish may run this on the subscription's own thread, which then
    // touches nothing more of it.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    --service_->subscribers_;
    delete this;
  }

 private:
  void Run() {
    KvEventPublisher* publisher = service_->kv_events_;
    grpc::Status status = grpc::Status::OK;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (broken_) {
          status = grpc::Status(grpc::StatusCode::CANCELLED, "the subscriber left");
          break;
        }
      }
      if (service_->stopping_) {
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
        break;
      }
      if (!publisher->WaitFor(next_, absl::Milliseconds(200))) continue;
      for (const auto& batch : publisher->Since(next_)) {
        message_ = ToProto(*batch);
        next_ = batch->seq + 1;
        {
          absl::MutexLock lock(&mu_);
          if (broken_) break;
          writing_ = true;
        }
        StartWrite(&message_);  // outside the lock: OnWriteDone may run on this thread
        // One write in flight: wait for it (or for the client to leave).
        absl::MutexLock lock(&mu_);
        auto written = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_ || broken_; };
        mu_.Await(absl::Condition(&written));
        if (broken_) break;
      }
    }
    Finish(status);
  }

  VllmService* service_;
  uint64_t next_;
  common_api::KvEventBatch message_;  // the write in flight
  std::thread thread_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerWriteReactor<common_api::KvEventBatch>* VllmService::SubscribeKvEvents(
    grpc::CallbackServerContext* context, const common_api::SubscribeKvEventsRequest* request) {
  using Refusal = ListWriter<common_api::KvEventBatch>;
  // Every tenant's stored blocks with their token ids: routers only.
  if (absl::StatusOr<Caller> c = auth_->Authorize(*context, Permission::kKvEvents); !c.ok()) {
    return new Refusal(c.status());
  }
  if (kv_events_ == nullptr) {
    // UNIMPLEMENTED, as a vLLM without events answers: SMG then stops asking.
    return new Refusal(absl::UnimplementedError("KV events are off: start the coordinator with --kv_events"));
  }
  if (++subscribers_ > kMaxKvSubscribers) {
    --subscribers_;
    return new Refusal(absl::ResourceExhaustedError(
        absl::StrFormat("%d KV-event subscribers already; retry later", kMaxKvSubscribers)));
  }
  // 0: from now on (the reference servicer's only mode); N: the kept batches
  // from N on, then live. An N this stream cannot continue from is said
  // plainly (OUT_OF_RANGE: a router then backs off) rather than answered
  // with a gap (SMG re-asks at once) or with silence until N comes round.
  uint64_t from = request->start_sequence_number();
  if (from == 0) {
    from = kv_events_->next_seq();
  } else if (from > kv_events_->next_seq()) {
    --subscribers_;
    return new Refusal(absl::OutOfRangeError(absl::StrFormat(
        "KV-event batch %d is ahead of this stream (next %d): the coordinator restarted; subscribe from 0 and "
        "treat what was indexed from it as gone",
        from, kv_events_->next_seq())));
  } else if (from < kv_events_->oldest_seq()) {
    --subscribers_;
    return new Refusal(absl::OutOfRangeError(absl::StrFormat(
        "KV-event batches from %d are no longer kept (the oldest is %d, --kv_events_buffer_steps): subscribe "
        "from 0 and rebuild the index",
        from, kv_events_->oldest_seq())));
  }
  return new Subscription(this, from);
}

}  // namespace chunkattn
