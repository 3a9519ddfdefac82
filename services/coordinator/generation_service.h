// The public API (chunkattn.v1.Generation) on gRPC's callback server: every
// handler validates its request (INVALID_ARGUMENT naming the field), and
// Generate posts to the Engine and streams what the engine's loop sends back.
// No handler blocks: text is tokenized on a small pool of threads (a long
// prompt must not stall the reactors streaming everyone else's tokens), one
// small reactor per Generate call owns the write queue, and a client cancel
// or deadline becomes Engine::Cancel.
//
// Thread-safe (gRPC calls it from its own threads).
#ifndef CHUNKATTN_SERVICES_COORDINATOR_GENERATION_SERVICE_H_
#define CHUNKATTN_SERVICES_COORDINATOR_GENERATION_SERVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chunkattn/v1/generation.grpc.pb.h"
#include "base/grpc_security.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/text_pool.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace chunkattn {

struct ServiceInfo {
  std::string model;         // as given on the command line
  bool prefix_sharing = true;
  int tensor_parallel_size = 1;
  int chunk_size = 64;
  std::string kv_dtype;
  int text_threads = 2;      // the pool that tokenizes text prompts
};

// Text prompts waiting for the text pool beyond which new ones are refused.
inline constexpr int kMaxQueuedTexts = 4096;
// The longest request id or cache namespace, bytes; the most ids one Abort
// call names. Every gRPC front's.
inline constexpr size_t kMaxIdBytes = 256;
inline constexpr int kMaxAbortIds = 1024;

// A fresh sampling seed for a request that names none (every front's).
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
};

// The prompt text of a conversation (`field` names it in errors): sizes are
// checked before anything is parsed or rendered; the template's own
// raise_exception is INVALID_ARGUMENT with its message.
absl::StatusOr<std::string> RenderChatPrompt(const v1::ChatPrompt& chat, const ModelChatTemplate& tmpl,
                                             const ModelConfig& config, absl::string_view field);

// A conversation's prompt text and its ids, as transformers'
// apply_chat_template(tokenize=True) makes them (no special tokens added: the
// template writes them). INVALID_ARGUMENT naming `field` when the model has
// no tokenizer or chat template, or as RenderChatPrompt.
struct PromptTokens {
  std::string text;  // the rendered conversation (empty for a text prompt)
  std::vector<int32_t> ids;
};
absl::StatusOr<PromptTokens> TokenizeChatPrompt(const v1::ChatPrompt& chat, const PromptText& text,
                                              const ModelConfig& config, absl::string_view field);

// The checked, tokenized form of a GenerateRequest. `seed` fills an unset
// sampling seed. With `fill_context` an unset max_new_tokens means up to the
// end of the context (OpenAI chat without max_tokens, as vLLM) rather than
// the default. Text and chat prompts cost time in their length: callers run
// this on the text pool for them.
// With `cap_to_context` a max_new_tokens past the end of the context is cut
// to it (vLLM's engine API) instead of refused.
absl::StatusOr<EngineRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                      const ModelConfig& config, const PromptText& text,
                                                      uint64_t seed, bool fill_context = false,
                                                      bool cap_to_context = false);

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // Everything is borrowed, also what `text` points to. Text and chat
  // prompts are tokenized on `text_pool`, which must be destroyed (so run
  // what it holds) before this service.
  // Every call must pass `auth` (a disabled TokenAuth lets all through); a
  // request's cache namespace is scoped to its tenant (TokenAuth).
  GenerationService(Engine* engine, const ModelConfig* config, PromptText text, ServiceInfo info,
                    const TokenAuth* auth, TextPool* text_pool);
  ~GenerationService() override;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* context,
                                                           const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context, const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetCacheStats(grpc::CallbackServerContext* context,
                                          const v1::GetCacheStatsRequest* request,
                                          v1::CacheStats* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetKvBlocks(grpc::CallbackServerContext* context, const v1::GetKvBlocksRequest* request,
                                        v1::KvBlocks* response) override;

 private:
  // Finishes `reactor` with UNAUTHENTICATED and returns true when the caller
  // does not pass auth_.
  // Finishes `reactor` with UNAUTHENTICATED or PERMISSION_DENIED unless the
  // caller may make a call of this kind.
  bool Denied(const grpc::CallbackServerContext& context, Permission permission,
              grpc::ServerUnaryReactor* reactor) const;

  Engine* engine_;
  const ModelConfig* config_;
  const PromptText text_;
  ServiceInfo info_;
  const TokenAuth* auth_;
  TextPool* text_pool_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_GENERATION_SERVICE_H_
