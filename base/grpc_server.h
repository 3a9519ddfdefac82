// Server options every gRPC port of ours shares. Needs gRPC's headers from its
// user (as grpc_status.h).
#ifndef CHUNKATTN_BASE_GRPC_SERVER_H_
#define CHUNKATTN_BASE_GRPC_SERVER_H_

#include "grpcpp/server_builder.h"

namespace chunkattn {

// gRPC binds with SO_REUSEPORT by default on Linux, so a second coordinator
// or worker started on an occupied port "succeeds" and takes a share of new
// connections. Without it the second bind fails and the process says so.
inline void ExclusivePort(grpc::ServerBuilder& builder) { builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0); }

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_GRPC_SERVER_H_
