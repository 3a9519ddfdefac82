// HOST:PORT flags (--listen, --workers, --server) parsed one way for every
// binary: "127.0.0.1:50051", "node-0.chunkattn:50061", "[::1]:50051".
#ifndef CHUNKATTN_BASE_ADDRESS_H_
#define CHUNKATTN_BASE_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace chunkattn {

struct HostPort {
  std::string host;  // IPv6 hosts keep their brackets
  int port = 0;
};

// INVALID_ARGUMENT naming `flag` unless `value` is HOST:PORT with a port in
// [min_port, 65535] (0 lets a server bind an ephemeral port). An IPv6 host
// must be in brackets.
inline absl::StatusOr<HostPort> ParseHostPort(absl::string_view flag, const std::string& value,
                                              int min_port = 1) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " \"", value, "\": ", why));
  };
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos) return bad("is not HOST:PORT (no port)");
  HostPort out;
  out.host = value.substr(0, colon);
  const std::string port = value.substr(colon + 1);
  if (!out.host.empty() && out.host.front() == '[') {
    if (out.host.back() != ']' || out.host.size() < 3) return bad("bad [IPv6] host");
  } else if (out.host.empty() || out.host.find(':') != std::string::npos) {
    return bad("is not HOST:PORT (IPv6 hosts go in brackets)");
  }
  if (!absl::SimpleAtoi(port, &out.port) || out.port < min_port || out.port > 65535) {
    return bad(absl::StrCat("port \"", port, "\" is not in ", min_port, "..65535"));
  }
  return out;
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_ADDRESS_H_
