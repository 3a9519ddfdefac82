#include "services/client/client.h"

#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpcpp/generic/generic_stub.h"

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
  const size_t colon = server.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError("--server \"" + server + "\" is not HOST:PORT (no port)");
  }
  std::string host = server.substr(0, colon);
  const std::string port = server.substr(colon + 1);
  if (!host.empty() && host.front() == '[') {
    if (host.back() != ']' || host.size() < 3) {
      return absl::InvalidArgumentError("--server \"" + server + "\": bad [IPv6] host");
    }
  } else if (host.empty() || host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError("--server \"" + server +
                                      "\" is not HOST:PORT (IPv6 hosts go in brackets)");
  }
  int p = 0;
  if (!absl::SimpleAtoi(port, &p) || p < 1 || p > 65535) {
    return absl::InvalidArgumentError("--server \"" + server + "\": port \"" + port +
                                      "\" is not in 1..65535");
  }
  return absl::OkStatus();
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

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::DataLossError("cannot read " + path);
  return s.str();
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

const char* StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    default: return "UNKNOWN";
  }
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
  std::fprintf(stderr, "error: %s: %s\n", StatusCodeName(status.error_code()),
               status.error_message().c_str());
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& server) {
  grpc::ChannelArguments args;
  // Prompts of a few thousand ids fit in the default 4 MiB; replies are small.
  return grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args);
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
