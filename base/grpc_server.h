// Server options every gRPC port of ours shares. Needs gRPC's headers from its
// user (as grpc_status.h).
#ifndef CHUNKATTN_BASE_GRPC_SERVER_H_
#define CHUNKATTN_BASE_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_interceptor.h"

namespace chunkattn {

// gRPC answers a request body it cannot parse with UNIMPLEMENTED (callback
// server) or INTERNAL (sync server), and a method it does not serve with
// UNIMPLEMENTED, all without a message, which sends a client hunting for a
// version mismatch. This names what went wrong: INVALID_ARGUMENT for the
// body, UNIMPLEMENTED naming the method. Only statuses without a message are
// rewritten: every status of our handlers has one.
class NamedBadRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit NamedBadRequestInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_MESSAGE) && methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      const grpc::StatusCode code = status.error_code();
      if (!status.error_message().empty()) {
        // A handler's own status: kept.
      } else if (unparsed_ && (code == grpc::StatusCode::UNIMPLEMENTED || code == grpc::StatusCode::INTERNAL)) {
        // The callback server says UNIMPLEMENTED, the sync server INTERNAL.
        methods->ModifySendStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                               "the request body is not a valid message for " + method_));
      } else if (code == grpc::StatusCode::UNIMPLEMENTED) {
        methods->ModifySendStatus(
            grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "method " + method_ + " is not served here"));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool unparsed_ = false;
};

class NamedBadRequestInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new NamedBadRequestInterceptor(info->method() != nullptr ? info->method() : "(unknown)");
  }
};

// Every server of ours: an exclusive port (below) and named bad requests.
inline void ConfigureServer(grpc::ServerBuilder& builder);

// gRPC binds with SO_REUSEPORT by default on Linux, so a second coordinator
// or worker started on an occupied port "succeeds" and takes a share of new
// connections. Without it the second bind fails and the process says so.
inline void ExclusivePort(grpc::ServerBuilder& builder) { builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0); }

inline void ConfigureServer(grpc::ServerBuilder& builder) {
  ExclusivePort(builder);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<NamedBadRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(factories));
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_GRPC_SERVER_H_
