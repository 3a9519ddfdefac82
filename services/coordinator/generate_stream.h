// The write side of one server-streaming Generate call on gRPC's callback
// API, for every gRPC front of the engine (chunkattn.v1.Generation and
// vllm.grpc.engine.VllmEngine): the engine's output thread hands it
// chunkattn.v1 responses (ResponseSink), a Translator turns each into the
// call's own messages, and the reactor writes them one at a time, then the
// final status. A client cancel or deadline becomes Engine::Cancel.
//
// Threads: Send/Finish from the engine's output thread; Submit from a gRPC
// or text-pool thread; the reactor's callbacks from gRPC's threads. The
// stream outlives the reactor (the engine may still hold it): after OnDone it
// drops everything.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_GENERATE_STREAM_H_
#define CHUNKATTN_SERVICES_COORDINATOR_GENERATE_STREAM_H_

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_status.h"
#include "chunkattn/v1/generation.pb.h"
#include "grpcpp/support/server_callback.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/output_processor.h"

namespace chunkattn {

// Turns the engine's responses into a call's messages. Translate appends
// what `response` becomes (possibly nothing) to `out`; Finish appends what
// ends the call before its status and returns that status (it may turn an
// error into messages and OK). Called under the stream's lock, in order.
template <typename Response>
class Translator {
 public:
  virtual ~Translator() = default;
  virtual void Translate(v1::GenerateResponse response, std::vector<Response>* out) = 0;
  virtual absl::Status Finish(absl::Status status, std::vector<Response>* out) {
    (void)out;
    return status;
  }
  // Whether every response (not only each sample's last) should carry the
  // running usage (ResponseSink::WantsRunningUsage).
  virtual bool WantsRunningUsage() const { return false; }
};

// chunkattn.v1: the engine's responses as they are.
class IdentityTranslator final : public Translator<v1::GenerateResponse> {
 public:
  void Translate(v1::GenerateResponse response, std::vector<v1::GenerateResponse>* out) override {
    out->push_back(std::move(response));
  }
};

template <typename Response>
class GenerateStreamReactor;

template <typename Response>
class GenerateStream final : public ResponseSink {
 public:
  GenerateStream(GenerateStreamReactor<Response>* reactor, std::unique_ptr<Translator<Response>> translator)
      : reactor_(reactor), translator_(std::move(translator)) {}

  void Send(v1::GenerateResponse response) override {
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finish_pending_) return;
      std::vector<Response> out;
      translator_->Translate(std::move(response), &out);
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

#endif  // CHUNKATTN_SERVICES_COORDINATOR_GENERATE_STREAM_H_
