#include "services/kv_events/block_hash.h"

#include <openssl/sha.h>

#include <vector>

namespace chunkattn {

namespace {

// Canonical CBOR (RFC 8949 §4.2.1) of the few shapes the chain hashes:
// the shortest head for every length and integer.
void Head(std::vector<uint8_t>* out, uint8_t major, uint64_t value) {
  const uint8_t m = static_cast<uint8_t>(major << 5);
  if (value < 24) {
    out->push_back(static_cast<uint8_t>(m | value));
    return;
  }
  int bytes = 8;
  uint8_t info = 27;
  if (value <= 0xff) {
    bytes = 1, info = 24;
  } else if (value <= 0xffff) {
    bytes = 2, info = 25;
  } else if (value <= 0xffffffffull) {
    bytes = 4, info = 26;
  }
  out->push_back(static_cast<uint8_t>(m | info));
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<uint8_t>(value >> (8 * i)));
}

void Text(std::vector<uint8_t>* out, std::string_view s) {
  Head(out, 3, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

BlockDigest Sha256(const std::vector<uint8_t>& bytes) {
  BlockDigest d;
  SHA256(bytes.data(), bytes.size(), d.data());
  return d;
}

}  // namespace

BlockDigest NoneDigest(std::string_view seed) {
  std::vector<uint8_t> cbor;
  Text(&cbor, seed);
  return Sha256(cbor);
}

BlockDigest ChainDigest(const BlockDigest& parent, absl::Span<const int32_t> tokens, std::string_view salt) {
  std::vector<uint8_t> cbor;
  cbor.reserve(40 + tokens.size() * 5 + salt.size());
  Head(&cbor, 4, 3);
  Head(&cbor, 2, parent.size());
  cbor.insert(cbor.end(), parent.begin(), parent.end());
  Head(&cbor, 4, tokens.size());
  for (int32_t t : tokens) Head(&cbor, 0, static_cast<uint32_t>(t));  // token ids are >= 0
  if (salt.empty()) {
    cbor.push_back(0xf6);  // null
  } else {
    Head(&cbor, 4, 1);
    Text(&cbor, salt);
  }
  return Sha256(cbor);
}

uint64_t PublishedHash(const BlockDigest& digest) {
  uint64_t h = 0;
  for (size_t i = digest.size() - 8; i < digest.size(); ++i) h = (h << 8) | digest[i];
  return h == 0 ? 1 : h;
}

}  // namespace chunkattn
