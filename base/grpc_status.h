// absl::Status <-> grpc::Status at the service edges. The codes are the same
// numbers in both, so the conversion is 1:1 and lives here once.
#ifndef CHUNKATTN_BASE_GRPC_STATUS_H_
#define CHUNKATTN_BASE_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace chunkattn {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// The message is prefixed with `context` (what was being done).
inline absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view context) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(context, ": ", s.error_message()));
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_GRPC_STATUS_H_
