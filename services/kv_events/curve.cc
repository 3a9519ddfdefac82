#include "services/kv_events/curve.h"

#include <zmq.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"

namespace chunkattn {

namespace {

absl::Status NoCurve(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": this libzmq has no CURVE (it was built without libsodium)"));
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") == 1; }

bool IsZ85Key(absl::string_view key) {
  if (key.size() != kCurveKeyZ85Chars) return false;
  char text[kCurveKeyZ85Chars + 1];
  std::memcpy(text, key.data(), key.size());
  text[kCurveKeyZ85Chars] = '\0';
  uint8_t bytes[32];
  // zmq_z85_decode rejects characters outside the alphabet and 5-character
  // groups worth 2^32 or more.
  return zmq_z85_decode(bytes, text) != nullptr;
}

absl::StatusOr<CurveKeyPair> GenerateCurveKeyPair() {
  if (!CurveAvailable()) return NoCurve("--kv_events_curve_keygen");
  char pub[kCurveKeyZ85Chars + 1], sec[kCurveKeyZ85Chars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::InternalError(absl::StrCat("zmq_curve_keypair: ", zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{pub, sec};
}

absl::StatusOr<std::string> CurvePublicKey(absl::string_view secret_key) {
  if (!CurveAvailable()) return NoCurve("CURVE");
  if (!IsZ85Key(secret_key)) return absl::InvalidArgumentError("not a Z85 CURVE key (40 characters)");
  const std::string sec(secret_key);
  char pub[kCurveKeyZ85Chars + 1];
  if (zmq_curve_public(pub, sec.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("zmq_curve_public: ", zmq_strerror(zmq_errno())));
  }
  return std::string(pub);
}

absl::StatusOr<std::vector<std::string>> ReadCurveKeysFile(const std::string& path, absl::string_view flag) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", text.status().message()));
  std::vector<std::string> keys;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (!IsZ85Key(line)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " line ", line_number,
                                                     " is not a Z85 CURVE key (40 characters, one per line)"));
    }
    keys.emplace_back(line);
  }
  if (keys.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no key"));
  return keys;
}

absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path, absl::string_view flag) {
  absl::StatusOr<std::vector<std::string>> keys = ReadCurveKeysFile(path, flag);
  if (!keys.ok()) return keys.status();
  if (keys->size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds ", keys->size(), " keys, expected one"));
  }
  return std::move(keys->front());
}

}  // namespace chunkattn
