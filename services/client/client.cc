#include "services/client/client.h"

#include <cstdio>
#include <fstream>
#include <future>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/address.h"
#include "base/grpc_security.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_interceptor.h"

namespace chunkattn::client {

absl::Status ValidateServer(const std::string& server) {
  if (server.empty()) return absl::InvalidArgumentError("--server HOST:PORT is required");
  // Targets with a scheme are gRPC's to resolve; only check they name something.
  for (const char* scheme : {"dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(server, scheme)) {
      if (server.size() == std::string(scheme).size()) {
        return absl::InvalidArgumentError("--server \"" + server + "\": nothing after the scheme");
      }
      return absl::OkStatus();
    }
  }
  return ParseHostPort("--server", server).status();
}

absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& csv) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(csv, ',')) {
    part = absl::StripAsciiWhitespace(part);
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError("--prompt_ids: \"" + std::string(part) +
                                        "\" is not a token id");
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot open " + path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!absl::StripAsciiWhitespace(line).empty()) lines.push_back(line);
  }
  return lines;
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_STOP_TOKEN: return "stop_token";
    case v1::FINISH_REASON_STOP_STRING: return "stop_string";
    case v1::FINISH_REASON_CANCELLED: return "cancelled";
    default: return "unspecified";
  }
}

void PrintRpcError(const grpc::Status& status) {
  std::fprintf(stderr, "error: %s: %s\n",
               absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())).c_str(),
               status.error_message().c_str());
}

namespace {

// Adds the bearer token to every call's initial metadata. Call credentials
// would do the same but gRPC refuses them on plaintext channels.
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // outlives the channel's interceptors: the channel owns the factory
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const ChannelOptions& options) {
  grpc::ChannelArguments args;
  // Prompts of a few thousand ids fit in the default 4 MiB; replies are small.
  ChannelSecurity security;  // plaintext
  if (options.tls) {
    TlsClientPem pem;
    pem.root_certs = options.tls_ca_pem;
    pem.server_name = options.tls_server_name;
    security = ChannelSecurityFromPem(pem);
  }
  security.Apply(&args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options.auth_token.empty()) {
    interceptors.push_back(std::make_unique<TokenInterceptorFactory>(options.auth_token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(options.server, security.credentials, args,
                                                                 std::move(interceptors));
}

absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                        double timeout_s, grpc::Status* rpc_status) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout_s);
  // HealthCheckRequest{service: ""} encodes to no bytes.
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  *rpc_status = done.get_future().get();
  if (!rpc_status->ok()) return absl::UnavailableError(rpc_status->error_message());
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::DataLossError("unreadable health response");
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  // HealthCheckResponse: field 1 (status, varint); absent = UNKNOWN.
  if (bytes.empty()) return std::string("UNKNOWN");
  if (bytes.size() == 2 && bytes[0] == 0x08) {
    switch (bytes[1]) {
      case 0: return std::string("UNKNOWN");
      case 1: return std::string("SERVING");
      case 2: return std::string("NOT_SERVING");
      case 3: return std::string("SERVICE_UNKNOWN");
    }
  }
  return absl::DataLossError("unexpected health response");
}

void SetDeadline(grpc::ClientContext* ctx, double timeout_s) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
}

}  // namespace chunkattn::client
