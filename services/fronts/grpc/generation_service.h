// The public API (chunkattn.v1.Generation) on gRPC's callback server: every
// handler validates its request (INVALID_ARGUMENT naming the field), and
// Generate translates its request to the coordinator's (FromProto), has the
// input processor check it, posts it to the Engine and streams back what the
// output processor emits, as this API's messages.
// No handler blocks: text is tokenized on a small pool of threads (a long
// prompt must not stall the reactors streaming everyone else's tokens), one
// small reactor per Generate call owns the write queue, and a client cancel
// or deadline becomes Engine::Cancel.
//
// Thread-safe (gRPC calls it from its own threads).
#ifndef CHUNKATTN_SERVICES_FRONTS_GRPC_GENERATION_SERVICE_H_
#define CHUNKATTN_SERVICES_FRONTS_GRPC_GENERATION_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "chunkattn/v1/generation.grpc.pb.h"
#include "base/grpc_security.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/input_processor.h"
#include "services/coordinator/output_processor.h"
#include "services/coordinator/request.h"
#include "services/coordinator/text_pool.h"

namespace chunkattn {

struct ServiceInfo {
  std::string model;         // as given on the command line
  bool prefix_sharing = true;
  int tensor_parallel_size = 1;
  int chunk_size = 64;
  std::string kv_dtype;
  int text_threads = 2;      // the pool that tokenizes text prompts
};

// A chunkattn.v1 GenerateRequest in the coordinator's terms (request.h).
// INVALID_ARGUMENT when it sets no prompt.
absl::StatusOr<ClientRequest> FromProto(const v1::GenerateRequest& request);

// The input processor's refusal as this API reports it: the field named as
// GenerateRequest names it ("stopping.max_new_tokens must be >= 1"). Any
// other status as it is.
absl::Status NameV1Fields(const absl::Status& status);

// What the output processor produced, as this API's message.
v1::GenerateResponse ToProto(const GenerationOutput& output);

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

#endif  // CHUNKATTN_SERVICES_FRONTS_GRPC_GENERATION_SERVICE_H_
