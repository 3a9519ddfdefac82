// Transport security and caller authentication: the coordinator's public
// API (--auth_token_file, TLS) and the workers' port (--worker_token_file:
// a secret the coordinator and its workers share; every worker RPC but
// health carries it).
//
// TLS: a certificate chain and key (PEM) turn the public port into TLS; a
// client CA on top requires and verifies client certificates (mutual TLS).
// The files are read once at start; a rotated certificate needs a restart
// (the Helm chart rolls the pods when the secret changes).
//
// Tokens: a file of bearer tokens, one per line ('#' starts a comment). A call
// must carry `authorization: Bearer <token>` naming one of them, or it gets
// UNAUTHENTICATED. Health and reflection stay open, so probes and tools such
// as grpcurl work without a token.
//
// Thread-safe after construction (TokenAuth is immutable).
#ifndef CHUNKATTN_BASE_GRPC_SECURITY_H_
#define CHUNKATTN_BASE_GRPC_SECURITY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace chunkattn {

struct TlsFiles {
  std::string cert_chain;  // PEM; empty with private_key = plaintext
  std::string private_key;
  std::string client_ca;   // PEM; non-empty = mutual TLS
};

// Insecure credentials when no file is named; INVALID_ARGUMENT when only one
// of cert/key is given or a client CA comes without them; NOT_FOUND /
// INVALID_ARGUMENT for a file that cannot be read or holds no PEM block.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& files);

// The tokens of a token file: one per line, '#' starts a comment, no
// whitespace inside a token; a file with none is INVALID_ARGUMENT. `flag`
// names the file in errors.
absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path, const std::string& flag);

class TokenAuth {
 public:
  TokenAuth() = default;  // disabled: every call passes

  // An empty path disables authentication. A file with no token is an error
  // (it would silently lock everyone out). `flag` names the file in errors.
  static absl::StatusOr<TokenAuth> FromFile(const std::string& path,
                                            const std::string& flag = "--auth_token_file");

  bool enabled() const { return !tokens_.empty(); }

  // OK, or UNAUTHENTICATED saying what is missing. Compares in constant time
  // per token so the reply's timing does not reveal a token's prefix.
  absl::Status Check(const grpc::ServerContextBase& context) const;

  // The client side: sends the file's first token (every line is accepted,
  // so a new secret can be rolled in as line one and the old one dropped
  // once every process has it). No-op when disabled.
  void Attach(grpc::ClientContext* context) const;

 private:
  explicit TokenAuth(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}
  std::vector<std::string> tokens_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_GRPC_SECURITY_H_
