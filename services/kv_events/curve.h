// ZMQ CURVE keys for the KV-event sockets (publisher.h). Keys are written in
// Z85, ZMQ's 40-character text form of a 32-byte key; its alphabet has no
// whitespace, quote or backslash, so a key is one word on a line. A key file
// holds one key per line (blank lines are skipped; no comments, since '#' is
// a Z85 character).
//
// Thread-safe: plain functions.
#ifndef CHUNKATTN_SERVICES_KV_EVENTS_CURVE_H_
#define CHUNKATTN_SERVICES_KV_EVENTS_CURVE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chunkattn {

inline constexpr size_t kCurveKeyZ85Chars = 40;

// Whether this libzmq was built with CURVE (libsodium); Debian's is.
bool CurveAvailable();

// Whether `key` is a Z85 key: 40 characters that decode to 32 bytes.
bool IsZ85Key(absl::string_view key);

struct CurveKeyPair {
  std::string public_key;  // Z85: give it to the clients (their CURVE server key)
  std::string secret_key;  // Z85: stays with the server
};
// A fresh keypair. FAILED_PRECONDITION without CURVE.
absl::StatusOr<CurveKeyPair> GenerateCurveKeyPair();
// The public key of a Z85 secret key. INVALID_ARGUMENT for a bad key,
// FAILED_PRECONDITION without CURVE.
absl::StatusOr<std::string> CurvePublicKey(absl::string_view secret_key);

// The one key of `path`. Errors start with `flag` (the option that named
// the file): cannot open it, no key, more than one, or a line that is not a
// Z85 key (its number given, never its text: it may be a secret).
absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path, absl::string_view flag);
// Every key of `path`, at least one; errors as ReadCurveKeyFile.
absl::StatusOr<std::vector<std::string>> ReadCurveKeysFile(const std::string& path, absl::string_view flag);

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_KV_EVENTS_CURVE_H_
