// Helpers shared by the `chunkattn` command-line client's subcommands: flag
// validation that runs before any RPC, and the one place that turns a gRPC
// status into the "error: CODE: message" line the client prints.
#ifndef CHUNKATTN_SERVICES_CLIENT_CLIENT_H_
#define CHUNKATTN_SERVICES_CLIENT_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chunkattn/v1/generation.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace chunkattn::client {

// Checks a --server value: "HOST:PORT" (HOST may be a [v6] literal) or a
// gRPC target with a scheme ("dns:///h:p", "unix:/path").
absl::Status ValidateServer(const std::string& server);

// "1,2,3" -> {1, 2, 3}. Empty parts are an error.
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& csv);

// The non-blank lines of a file; NOT_FOUND if it cannot be read. (The whole
// file: ReadFileToString in base/file.h.)
absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& path);

// "length" for FINISH_REASON_LENGTH, and so on.
std::string FinishReasonName(v1::FinishReason reason);

// Prints "error: <CODE>: <message>" to stderr.
void PrintRpcError(const grpc::Status& status);

// How to reach the coordinator: plaintext by default; TLS with the system's
// roots or a given CA; a bearer token sent as `authorization` metadata on
// every call (allowed on plaintext too, e.g. through a port-forward).
struct ChannelOptions {
  std::string server;           // HOST:PORT or a gRPC target
  bool tls = false;
  std::string tls_ca_pem;       // PEM roots; empty = the system's (implies nothing unless tls)
  std::string tls_server_name;  // overrides the name checked against the certificate
  std::string auth_token;       // empty = none
};

std::shared_ptr<grpc::Channel> MakeChannel(const ChannelOptions& options);

// grpc.health.v1.Health/Check for the server as a whole (service ""), without
// generated health stubs: "SERVING", "NOT_SERVING", "UNKNOWN" or
// "SERVICE_UNKNOWN"; the RPC's status if it fails.
absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                        double timeout_s, grpc::Status* rpc_status);

// Sets the call's deadline to now + timeout_s seconds.
void SetDeadline(grpc::ClientContext* ctx, double timeout_s);

}  // namespace chunkattn::client

#endif  // CHUNKATTN_SERVICES_CLIENT_CLIENT_H_
