// Comparing secrets (tokens) without an early exit, so a reply's timing does
// not reveal how much of a guess was right.
#ifndef CHUNKATTN_BASE_CONSTANT_TIME_H_
#define CHUNKATTN_BASE_CONSTANT_TIME_H_

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace chunkattn {

// Equal length and bytes; the time depends only on the lengths.
inline bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The credential of an Authorization value "Bearer <token>" (the scheme in
// any case); empty when the value is not of that form.
inline absl::string_view BearerCredential(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "Bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return {};
  }
  return authorization.substr(kScheme.size());
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_CONSTANT_TIME_H_
