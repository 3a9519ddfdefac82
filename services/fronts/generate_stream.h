// The write side of one server-streaming Generate call on gRPC's callback
// API, for every gRPC front of the engine (chunkattn.v1.Generation and
// vllm.grpc.engine.VllmEngine): the engine's output thread hands it
// GenerationOutputs (ResponseSink), the front's Translator turns each into
// the call's own messages, and the reactor writes them one at a time, then
// the final status. A client cancel or deadline becomes Engine::Cancel.
// Wire-neutral: it knows no API's messages.
//
// Threads: Send/Finish from the engine's output thread; Submit from a gRPC
// or text-pool thread (ProcessAndSubmit calls it on the right one); the
// reactor's callbacks from gRPC's threads. The stream outlives the reactor
// (the engine may still hold it): after OnDone it drops everything.
#ifndef CHUNKATTN_SERVICES_FRONTS_GENERATE_STREAM_H_
#define CHUNKATTN_SERVICES_FRONTS_GENERATE_STREAM_H_

#include <deque>
#include <memory>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_status.h"
#include "grpcpp/support/server_callback.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/input_processor.h"
#include "services/coordinator/output_processor.h"
#include "services/coordinator/request.h"
#include "services/coordinator/text_pool.h"

namespace chunkattn {

// Turns the engine's outputs into a call's messages. Translate appends
// what `output` becomes (possibly nothing) to `out`; Finish appends what
// ends the call before its status and returns that status (it may turn an
// error into messages and OK). Called under the stream's lock, in order.
template <typename Response>
class Translator {
 public:
  virtual ~Translator() = default;
  virtual void Translate(GenerationOutput output, std::vector<Response>* out) = 0;
  virtual absl::Status Finish(absl::Status status, std::vector<Response>* out) {
    (void)out;
    return status;
  }
  // Whether every output (not only each sample's last) should carry the
  // running usage (ResponseSink::WantsRunningUsage).
  virtual bool WantsRunningUsage() const { return false; }
};

template <typename Response>
class GenerateStreamReactor;

template <typename Response>
class GenerateStream final : public ResponseSink {
 public:
  GenerateStream(GenerateStreamReactor<Response>* reactor, std::unique_ptr<Translator<Response>> translator)
      : reactor_(reactor), translator_(std::move(translator)) {}

  void Send(GenerationOutput output) override {
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finish_pending_) return;
      std::vector<Response> out;
      translator_->Translate(std::move(output), &out);
      for (Response& r : out) queue_.push_back(std::move(r));
    }
    Pump();
  }

  void Finish(absl::Status status) override {
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finish_pending_) return;
      std::vector<Response> out;
      final_ = ToGrpcStatus(translator_->Finish(std::move(status), &out));
      for (Response& r : out) queue_.push_back(std::move(r));
      finish_pending_ = true;
    }
    Pump();
  }

  bool WantsRunningUsage() const override { return translator_->WantsRunningUsage(); }

  void OnWriteDone(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      writing_ = false;
      if (!ok) queue_.clear();  // the call is broken; only Finish is left
    }
    Pump();
  }

  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  void Pump() {
    const Response* message = nullptr;
    grpc::Status status;
    GenerateStreamReactor<Response>* reactor;
    {
      absl::MutexLock lock(&mu_);
      reactor = reactor_;
      if (reactor == nullptr || writing_ || finished_) return;
      if (!queue_.empty()) {
        writing_ = true;
        message = &queue_.front();
      } else if (finish_pending_) {
        finished_ = true;
        status = final_;
      } else {
        return;
      }
    }
    // Outside the lock: a reaction may run on this thread.
    if (message != nullptr) {
      reactor->StartWrite(message);
    } else {
      reactor->Finish(status);
    }
  }

  absl::Mutex mu_;
  GenerateStreamReactor<Response>* reactor_ ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<Translator<Response>> translator_;  // used under mu_
  std::deque<Response> queue_ ABSL_GUARDED_BY(mu_);  // front is in flight while writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
};

template <typename Response>
class GenerateStreamReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  GenerateStreamReactor(Engine* engine, std::unique_ptr<Translator<Response>> translator)
      : engine_(engine), stream_(std::make_shared<GenerateStream<Response>>(this, std::move(translator))) {}

  void Reject(const absl::Status& status) { stream_->Finish(status); }
  // Has the input processor check `request`, then submits it, or rejects the
  // call with the refusal as `name_fields` names its field in the call's
  // API. A token-id prompt is checked here, in time proportional to what
  // gRPC already parsed; text and chat on `text_pool` (RESOURCE_EXHAUSTED
  // when it is full). `config` and `text` must outlive the pool's tasks.
  void ProcessAndSubmit(ClientRequest request, const ModelConfig* config, const PromptText* text, TextPool* text_pool,
                        absl::Status (*name_fields)(const absl::Status&)) {
    const bool token_ids = std::holds_alternative<TokenPrompt>(request.prompt);
    // The reactor lives until it finishes, which nothing does before this runs.
    auto process = [this, request = std::move(request), config, text, name_fields] {
      absl::StatusOr<EngineRequest> processed = ProcessInput(request, *config, *text);
      if (!processed.ok()) {
        Reject(name_fields(processed.status()));
        return;
      }
      Submit(*std::move(processed));
    };
    if (token_ids) {
      process();
    } else if (!text_pool->Post(std::move(process))) {
      Reject(absl::ResourceExhaustedError(
          absl::StrFormat("%d text prompts are waiting to be tokenized; retry later", kMaxQueuedTexts)));
    }
  }
  // From a gRPC thread or a text pool thread; OnCancel may race with it.
  void Submit(EngineRequest request) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      stream_->Finish(absl::CancelledError("cancelled by the client"));
      return;
    }
    id_ = engine_->Submit(std::move(request), stream_);
  }

  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnCancel() override {
    int64_t id;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      id = id_;
    }
    if (id != 0) engine_->Cancel(id);
  }
  void OnDone() override {
    stream_->Detach();
    delete this;
  }

 private:
  Engine* engine_;
  std::shared_ptr<GenerateStream<Response>> stream_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_FRONTS_GENERATE_STREAM_H_
