// vllm.grpc.engine.VllmEngine (proto/vllm/grpc/engine/vllm_engine.proto):
// the gRPC engine API that SMG (the Shepherd Model Gateway) and the llm-d
// router speak to vLLM (`vllm serve --grpc`), served by the coordinator on
// its gRPC port beside chunkattn.v1.Generation, on the same Engine. How each
// reply is filled, and what is refused: docs/design/vllm-engine-api.md.
//
// Generate takes token ids (or text, tokenized on the text pool) and
// translates them to the coordinator's request, checked by the same input
// processor as every front, so one prompt and seed give the same tokens on
// every API. A request's cache
// namespace is its tenant's (bearer tokens), as on the other fronts: this
// API has no namespace field. SubscribeKvEvents streams the KV-event
// publisher's batches (the same ones as the ZMQ socket), each subscriber on
// its own thread, at most kMaxKvSubscribers at once.
//
// Thread-safe (gRPC calls it from its own threads).
#ifndef CHUNKATTN_SERVICES_FRONTS_VLLM_VLLM_SERVICE_H_
#define CHUNKATTN_SERVICES_FRONTS_VLLM_VLLM_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/grpc_security.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/input_processor.h"
#include "services/coordinator/request.h"
#include "services/coordinator/text_pool.h"
#include "services/kv_events/publisher.h"
#include "vllm/grpc/engine/vllm_engine.grpc.pb.h"

namespace chunkattn {

inline constexpr int kMaxKvSubscribers = 64;

struct VllmServiceInfo {
  std::string model_path;         // --model
  std::string served_model_name;  // --served_model_name
  std::string version;            // the coordinator's
  int chunk_size = 64;            // tokens per KV chunk (GetLoads' token figures)
  int64_t max_running_requests = 0;
};

// A VllmEngine GenerateRequest in the coordinator's terms (request.h), with
// vLLM's max_tokens rules: unset is up to the end of the context, and past
// it is cut to it. INVALID_ARGUMENT for what chunkattn does not do
// (constraints, penalties, logit_bias, prompt logprobs, multimodal inputs,
// KV transfer, truncation), naming the field.
absl::StatusOr<ClientRequest> TranslateVllmRequest(const vllm::grpc::engine::GenerateRequest& request);

// The input processor's refusal as this API reports it: the field named as
// vLLM's GenerateRequest names it ("sampling_params.max_tokens must be
// >= 1"). Any other status as it is.
absl::Status NameVllmFields(const absl::Status& status);

// A zip archive (stored, not compressed) of `files`: (name in the archive,
// contents). INVALID_ARGUMENT past the zip format's 32-bit sizes.
absl::StatusOr<std::string> StoredZip(const std::vector<std::pair<std::string, std::string>>& files);

class VllmService final : public vllm::grpc::engine::VllmEngine::CallbackService {
 public:
  // Everything is borrowed; `kv_events` may be null (SubscribeKvEvents then
  // FAILED_PRECONDITION). `text_pool` must be destroyed before this service.
  VllmService(Engine* engine, const ModelConfig* config, PromptText text, VllmServiceInfo info,
                    const TokenAuth* auth, TextPool* text_pool, KvEventPublisher* kv_events);
  ~VllmService() override;
  // Ends the event subscriptions (within 200 ms): before the server shuts
  // down, which would otherwise wait for them.
  void Shutdown();

  grpc::ServerWriteReactor<vllm::grpc::engine::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const vllm::grpc::engine::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* HealthCheck(grpc::CallbackServerContext* context,
                                        const vllm::grpc::engine::HealthCheckRequest* request,
                                        vllm::grpc::engine::HealthCheckResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const vllm::grpc::engine::AbortRequest* request,
                                  vllm::grpc::engine::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const vllm::grpc::engine::GetModelInfoRequest* request,
                                         vllm::grpc::engine::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const vllm::grpc::engine::GetServerInfoRequest* request,
                                          vllm::grpc::engine::GetServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetLoads(grpc::CallbackServerContext* context,
                                     const vllm::grpc::engine::GetLoadsRequest* request,
                                     vllm::grpc::engine::GetLoadsResponse* response) override;
  grpc::ServerWriteReactor<smg::grpc::common::GetTokenizerChunk>* GetTokenizer(
      grpc::CallbackServerContext* context, const smg::grpc::common::GetTokenizerRequest* request) override;
  grpc::ServerWriteReactor<smg::grpc::common::KvEventBatch>* SubscribeKvEvents(
      grpc::CallbackServerContext* context, const smg::grpc::common::SubscribeKvEventsRequest* request) override;

 private:
  class Subscription;
  // Finishes `reactor` with UNAUTHENTICATED or PERMISSION_DENIED unless the
  // caller may make a call of this kind.
  bool Denied(const grpc::CallbackServerContext& context, Permission permission,
              grpc::ServerUnaryReactor* reactor) const;

  Engine* engine_;
  const ModelConfig* config_;
  const PromptText text_;
  const VllmServiceInfo info_;
  const TokenAuth* auth_;
  TextPool* text_pool_;
  KvEventPublisher* kv_events_;
  const absl::Time started_;
  std::atomic<double> last_receive_{0};  // unix seconds of the last Generate
  std::atomic<int> subscribers_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_FRONTS_VLLM_VLLM_SERVICE_H_
