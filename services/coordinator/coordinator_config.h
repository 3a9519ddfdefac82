// chunkattn-coordinator's command line as one checked struct: the flags are
// defined and read only in coordinator_config.cc, and every one is validated
// there, before anything starts (a bad flag is INVALID_ARGUMENT naming it, or
// the file it names). main (coordinator_main.cc) is parsing plus assembly.
//
// What depends on the model (its context length, EOS ids) is filled in once
// the model folder is read: EngineOptionsFor, HttpOptionsFor.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_COORDINATOR_CONFIG_H_
#define CHUNKATTN_SERVICES_COORDINATOR_COORDINATOR_CONFIG_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/address.h"
#include "base/grpc_security.h"
#include "grpcpp/security/server_credentials.h"
#include "proto/model/model_config.h"
#include "services/coordinator/engine.h"
#include "services/http/http_server.h"
#include "services/kv_events/publisher.h"

namespace chunkattn {

struct CoordinatorConfig {
  // The public gRPC API, and the ports beside it (0 = off).
  std::string listen;
  HostPort listen_address;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  bool tls() const { return !tls_files.cert_chain.empty(); }  // the API ports serve TLS
  TlsFiles tls_files;     // also the HTTP API's
  TokenAuth auth;         // tenant, router and operator tokens (base/grpc_security.h)
  int health_port = 0;
  int metrics_port = 0;
  std::string metrics_host;
  std::vector<std::string> metrics_tokens;
  int http_port = 0;
  std::string http_host;

  // The model, as the workers load it and the APIs name it.
  std::string model;
  std::string load_format;        // auto | dummy
  std::string served_model_name;  // default: model
  int chunk_size = 64;
  std::string kv_dtype;
  int tokenize_threads = 2;
  int64_t max_sequences_per_request = 256;
  std::string tool_call_parser = "auto";  // a tools::ToolCallFormat name, or auto
  std::string reasoning_parser = "auto";  // auto | qwen3 | none

  // The engine and its workers, less what the model decides (EngineOptionsFor).
  EngineOptions engine;
  bool worker_tls = false;
  bool worker_mtls = false;
  absl::Duration drain_timeout = absl::Seconds(30);

  // KV events for routers; none when off.
  std::optional<KvEventPublisherOptions> kv_events;

  // The HTTP guard's flags as given (0 = derived: HttpOptionsFor).
  int64_t http_max_connections = 0;
  int64_t http_max_connections_per_peer = 0;
  int64_t http_max_body_bytes = 0;
  int64_t http_max_buffered_body_bytes = 0;
  double http_header_timeout_s = 10;
  double http_body_timeout_s = 60;
};

// The flags, checked. INVALID_ARGUMENT naming the flag; files (TLS, tokens,
// CURVE keys) are read here, so a missing one fails before anything starts.
absl::StatusOr<CoordinatorConfig> CoordinatorConfigFromFlags();

// --kv_events_curve_keygen: print a keypair and exit.
bool CurveKeygenRequested();

// The engine's options for `model`: its context and EOS ids on top of the
// flags', and the publisher (borrowed, may be null).
EngineOptions EngineOptionsFor(const CoordinatorConfig& config, const ModelConfig& model,
                               KvEventPublisher* kv_events);

// The HTTP guard from the flags: 0 means the default, derived from the
// descriptors the process may open (after raising its soft limit) and from
// the model's context. INVALID_ARGUMENT naming the flag. Also serves the
// checks of the flags while the HTTP API is off.
absl::StatusOr<http::Options> HttpOptionsFor(const CoordinatorConfig& config, int32_t max_context);

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_COORDINATOR_CONFIG_H_
