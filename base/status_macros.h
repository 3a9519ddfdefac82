// Local stand-ins for the status macros that Debian's Abseil (20220623) lacks.
#ifndef CHUNKATTN_BASE_STATUS_MACROS_H_
#define CHUNKATTN_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CHUNKATTN_CONCAT_INNER_(a, b) a##b
#define CHUNKATTN_CONCAT_(a, b) CHUNKATTN_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status _status_ = (expr);            \
    if (!_status_.ok()) return _status_;         \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or return its error.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(CHUNKATTN_CONCAT_(_statusor_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                           \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()

#endif  // CHUNKATTN_BASE_STATUS_MACROS_H_
