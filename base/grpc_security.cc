#include "base/grpc_security.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/constant_time.h"
#include "base/file.h"
#include "grpcpp/security/server_credentials.h"

namespace chunkattn {
namespace {

absl::StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  return text;
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFlagFile(flag, path);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM block"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& files) {
  if (files.cert_chain.empty() && files.private_key.empty()) {
    if (!files.client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
    }
    return grpc::InsecureServerCredentials();
  }
  if (files.cert_chain.empty() || files.private_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
  }
  grpc::SslServerCredentialsOptions options(files.client_ca.empty()
                                                ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  absl::StatusOr<std::string> cert = ReadPem("--tls_cert_file", files.cert_chain);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("--tls_key_file", files.private_key);
  if (!key.ok()) return key.status();
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!files.client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("--tls_client_ca_file", files.client_ca);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  return grpc::SslServerCredentials(options);
}

void ChannelSecurity::Apply(grpc::ChannelArguments* args) const {
  if (!server_name.empty()) args->SetSslTargetNameOverride(server_name);
}

ChannelSecurity ChannelSecurityFromPem(const TlsClientPem& pem) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.root_certs;
  ssl.pem_cert_chain = pem.cert_chain;
  ssl.pem_private_key = pem.private_key;
  ChannelSecurity security;
  security.credentials = grpc::SslCredentials(ssl);
  security.server_name = pem.server_name;
  return security;
}

absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsClientFiles& files) {
  if (files.cert_chain.path.empty() != files.private_key.path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.cert_chain.flag, " and ", files.private_key.flag, " go together"));
  }
  TlsClientPem pem;
  pem.server_name = files.server_name;
  const std::pair<const FlagFile*, std::string*> reads[] = {
      {&files.ca, &pem.root_certs}, {&files.cert_chain, &pem.cert_chain}, {&files.private_key, &pem.private_key}};
  for (const auto& [file, text] : reads) {
    if (file->path.empty()) continue;
    absl::StatusOr<std::string> read = ReadPem(file->flag, file->path);
    if (!read.ok()) return read.status();
    *text = *std::move(read);
  }
  return ChannelSecurityFromPem(pem);
}

absl::StatusOr<TokenAuth> TokenAuth::FromFile(const std::string& path, const std::string& flag) {
  if (path.empty()) return TokenAuth();
  absl::StatusOr<std::vector<TokenEntry>> tokens = ReadTokenEntries(path, flag);
  if (!tokens.ok()) return tokens.status();
  return TokenAuth(*std::move(tokens));
}

absl::StatusOr<std::vector<TokenEntry>> ReadTokenEntries(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::string> text = ReadFlagFile(flag, path);
  if (!text.ok()) return text.status();
  std::vector<TokenEntry> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": line ", line_number, ": expected 'TOKEN' or 'TOKEN TENANT' or 'TOKEN role:ROLE'"));
    }
    TokenEntry entry{std::string(fields[0]), fields.size() == 2 ? std::string(fields[1]) : std::string()};
    if (fields.size() == 2 && absl::ConsumePrefix(&fields[1], "role:")) {
      entry.tenant.clear();
      if (fields[1] == "router") {
        entry.role = Role::kRouter;
      } else if (fields[1] == "operator") {
        entry.role = Role::kOperator;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": line ", line_number, ": a role is role:router or role:operator"));
      }
    } else if (fields.size() == 2) {
      const bool ok = entry.tenant.size() <= 64 && std::all_of(entry.tenant.begin(), entry.tenant.end(), [](char c) {
                        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
                      });
      if (!ok) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": line ", line_number, ": a tenant is 1 to 64 of [A-Za-z0-9._-]"));
      }
    }
    tokens.push_back(std::move(entry));
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " has no token"));
  return tokens;
}

absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::vector<TokenEntry>> entries = ReadTokenEntries(path, flag);
  if (!entries.ok()) return entries.status();
  std::vector<std::string> tokens;
  for (TokenEntry& e : *entries) {
    if (!e.tenant.empty() || e.role != Role::kTenant) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": a token must not contain whitespace"));
    }
    tokens.push_back(std::move(e.token));
  }
  return tokens;
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kTenant: return "tenant";
    case Role::kRouter: return "router";
    case Role::kOperator: return "operator";
  }
  return "?";
}

absl::Status Caller::Allow(Permission permission) const {
  if (!authenticated) return absl::OkStatus();
  switch (permission) {
    case Permission::kModelInfo:
      return absl::OkStatus();
    case Permission::kGenerate:
      if (role == Role::kTenant) return absl::OkStatus();
      return absl::PermissionDeniedError(
          absl::StrCat("a ", RoleName(role), " credential sends no requests: use a tenant's token"));
    case Permission::kPoolStats:
      if (role != Role::kTenant) return absl::OkStatus();
      return absl::PermissionDeniedError(
          "pool-wide figures need a router or operator token ('TOKEN role:operator' in --auth_token_file)");
    case Permission::kKvEvents:
      if (role == Role::kRouter) return absl::OkStatus();
      return absl::PermissionDeniedError(
          "KV events and blocks carry every tenant's prompts: they need a router token ('TOKEN role:router' in "
          "--auth_token_file)");
  }
  return absl::PermissionDeniedError("unknown permission");
}

absl::StatusOr<Caller> TokenAuth::Authenticate(const grpc::ServerContextBase& context) const {
  if (!enabled()) return Caller();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  return Authenticate(absl::string_view(it->second.data(), it->second.size()));
}

absl::StatusOr<Caller> TokenAuth::Authenticate(absl::string_view authorization) const {
  if (!enabled()) return Caller();
  if (authorization.empty()) return absl::UnauthenticatedError("missing 'Authorization: Bearer <token>'");
  const absl::string_view presented = BearerCredential(authorization);
  if (presented.empty()) return absl::UnauthenticatedError("authorization must be 'Bearer <token>'");
  // Every token is compared, whichever matches.
  const TokenEntry* match = nullptr;
  size_t index = 0;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (ConstantTimeEquals(presented, tokens_[i].token) && match == nullptr) {
      match = &tokens_[i];
      index = i;
    }
  }
  if (match == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  Caller caller;
  caller.authenticated = true;
  caller.role = match->role;
  caller.tenant = match->tenant.empty() ? absl::StrCat("k:", index + 1) : absl::StrCat("t:", match->tenant);
  return caller;
}

absl::StatusOr<Caller> TokenAuth::Authorize(const grpc::ServerContextBase& context, Permission permission) const {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (caller.ok()) {
    if (absl::Status allowed = caller->Allow(permission); !allowed.ok()) return allowed;
  }
  return caller;
}

absl::StatusOr<Caller> TokenAuth::Authorize(absl::string_view authorization, Permission permission) const {
  absl::StatusOr<Caller> caller = Authenticate(authorization);
  if (caller.ok()) {
    if (absl::Status allowed = caller->Allow(permission); !allowed.ok()) return allowed;
  }
  return caller;
}

void TokenAuth::Attach(grpc::ClientContext* context) const {
  if (enabled()) context->AddMetadata("authorization", absl::StrCat("Bearer ", tokens_.front().token));
}

}  // namespace chunkattn
