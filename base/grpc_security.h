// Transport security and caller authentication: the coordinator's public
// API (--auth_token_file, TLS) and the workers' port (--worker_token_file:
// a secret the coordinator and its workers share; every worker RPC but
// health carries it).
//
// TLS: a certificate chain and key (PEM) turn a port into TLS; a client CA on
// top requires and verifies client certificates (mutual TLS). The client side
// (the coordinator calling its workers, a rank calling rank 0's rendezvous
// store, the CLI) verifies the server against a CA and may present a
// certificate of its own. The files are read once at start; a rotated
// certificate needs a restart (the Helm chart rolls the pods when the secret
// changes).
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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"

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

// How a client opens its channels: the credentials, and the name the server's
// certificate must carry when that is not the target's host (one certificate
// for every worker, whatever its address). Default: plaintext.
struct ChannelSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  std::string server_name;  // TLS only; empty = the target's host

  // Puts the server-name override, if any, into the channel's arguments.
  void Apply(grpc::ChannelArguments* args) const;
};

// The client side of TLS, as PEM text (not paths).
struct TlsClientPem {
  std::string root_certs;   // the server's certificate must chain to these; empty = the system's roots
  std::string cert_chain;   // this client's certificate (mutual TLS); empty with private_key = none
  std::string private_key;
  std::string server_name;  // see ChannelSecurity
};

// TLS credentials from PEM text; never fails (a bad PEM fails the calls).
ChannelSecurity ChannelSecurityFromPem(const TlsClientPem& pem);

// A file a command-line flag names: `flag` names it in errors.
struct FlagFile {
  std::string flag;  // "--worker_tls_ca_file"
  std::string path;  // empty = not given
};

struct TlsClientFiles {
  FlagFile ca;           // PEM roots; no path = the system's roots
  FlagFile cert_chain;   // PEM client certificate; no path with private_key = none
  FlagFile private_key;
  std::string server_name;  // see ChannelSecurity
};

// TLS credentials from files, read now. INVALID_ARGUMENT when only one of
// cert/key is given; NOT_FOUND / INVALID_ARGUMENT for a file that cannot be
// read or holds no PEM block (as MakeServerCredentials). Whether to use TLS
// at all is the caller's choice: this always makes TLS credentials.
absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsClientFiles& files);

// What a credential is for. Tenants send requests and see only what derives
// from their own; the other roles read what spans every tenant and send no
// requests (SECURITY.md, "Who may see what").
enum class Role {
  kTenant,    // generation, tokenization, Abort of its own requests
  kRouter,    // the KV-event stream and block listings (every tenant's token
              // ids), and the pool-wide load and cache figures
  kOperator,  // the pool-wide load and cache figures only
};
absl::string_view RoleName(Role role);

// The kinds of call, by what they reveal or use.
enum class Permission {
  kModelInfo,  // the model, the tokenizer: any credential
  kGenerate,   // requests: tenants only
  kPoolStats,  // pool-wide figures (every tenant's traffic): routers, operators
  kKvEvents,   // KV events and blocks (every tenant's token ids): routers
};

// A token file: one token per line, optionally followed by the tenant it is
// bound to or its role ("TOKEN", "TOKEN TENANT", "TOKEN role:router",
// "TOKEN role:operator"; a tenant is 1 to 64 of [A-Za-z0-9._-]); '#' starts a
// comment. A file with no token is INVALID_ARGUMENT. `flag` names the file in
// errors.
struct TokenEntry {
  std::string token;
  std::string tenant;  // empty: not bound
  Role role = Role::kTenant;
};
absl::StatusOr<std::vector<TokenEntry>> ReadTokenEntries(const std::string& path, const std::string& flag);
// The tokens alone, for files where tenants mean nothing (INVALID_ARGUMENT
// when a line names one).
absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path, const std::string& flag);

// Who made a call (TokenAuth::Authenticate).
struct Caller {
  // "" when authentication is off; else "t:<tenant>" for a bound token,
  // "k:<n>" for the file's n-th token when it is not bound: two unbound
  // tokens are two tenants (they share no cache and cannot Abort each
  // other's requests).
  std::string tenant;
  Role role = Role::kTenant;
  bool authenticated = false;  // false: authentication is off, every call passes

  // OK, or PERMISSION_DENIED naming the role the call needs.
  absl::Status Allow(Permission permission) const;
};

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
  absl::Status Check(const grpc::ServerContextBase& context) const { return Authenticate(context).status(); }

  // The caller, from the `authorization` metadata or an HTTP Authorization
  // header's value. UNAUTHENTICATED as Check.
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContextBase& context) const;
  absl::StatusOr<Caller> Authenticate(absl::string_view authorization) const;
  // Authenticate, then Caller::Allow: UNAUTHENTICATED or PERMISSION_DENIED.
  absl::StatusOr<Caller> Authorize(const grpc::ServerContextBase& context, Permission permission) const;
  absl::StatusOr<Caller> Authorize(absl::string_view authorization, Permission permission) const;

  // The client side: sends the file's first token (every line is accepted,
  // so a new secret can be rolled in as line one and the old one dropped
  // once every process has it). No-op when disabled.
  void Attach(grpc::ClientContext* context) const;

 private:
  explicit TokenAuth(std::vector<TokenEntry> tokens) : tokens_(std::move(tokens)) {}
  std::vector<TokenEntry> tokens_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_GRPC_SECURITY_H_
