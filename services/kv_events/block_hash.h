// The KV-event block hash: vLLM's `sha256_cbor` chain, so that a block's hash
// here equals vLLM's for the same tokens, block size and seed
// (`--prefix-caching-hash-algo sha256_cbor`, `PYTHONHASHSEED=<seed>`):
//
//   digest(block k) = SHA-256(canonical CBOR [digest(block k-1) or NONE,
//                                             [token ids], extra_keys or null])
//   NONE            = SHA-256(canonical CBOR of the seed, a text string)
//
// extra_keys is `[namespace]` for block 0 of a tree whose namespace is not
// empty (vLLM's cache_salt, which goes into block 0 only) and null otherwise.
// The chain runs on full 32-byte digests; what is published is the digest's
// last 8 bytes read big-endian (vLLM's integer form), with 0 sent as 1
// because consumers read a parent hash of 0 as "no parent".
#ifndef CHUNKATTN_SERVICES_KV_EVENTS_BLOCK_HASH_H_
#define CHUNKATTN_SERVICES_KV_EVENTS_BLOCK_HASH_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/types/span.h"

namespace chunkattn {

using BlockDigest = std::array<uint8_t, 32>;

// NONE: the parent digest of block 0.
BlockDigest NoneDigest(std::string_view seed);

// The digest of a block after `parent` (NoneDigest for block 0) holding
// `tokens`; `salt` non-empty only for block 0 of a namespaced tree.
BlockDigest ChainDigest(const BlockDigest& parent, absl::Span<const int32_t> tokens, std::string_view salt);

// The 64-bit hash published for `digest`.
uint64_t PublishedHash(const BlockDigest& digest);

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_KV_EVENTS_BLOCK_HASH_H_
