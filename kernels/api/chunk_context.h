// The (C, i, j) context: how the live sequences of a prefix forest map onto
// physical KV chunks, as plain arrays the decode kernels consume (section 3.3
// of the ChunkAttention paper). Host-only; built by services/core/PrefixForest,
// copied to the device only when `version` changes.
//
// Sequences are numbered 0..num_seqs-1 in "context order": an order in which
// the sequences that read any one chunk form one contiguous range [i, j). A
// chunk read by two or more sequences is *shared* and listed once with its
// range; a chunk read by one sequence is *private* and listed under it. Along
// any sequence the shared chunks come first (a prefix of its path) and its
// private chunks follow, so:
//   path(s) = [shared entries k with begin[k] <= s < end[k], in table order]
//             ++ private_chunk[private_begin[s] .. private_end[s])
// and chunk n of that path holds tokens [n*c, min((n+1)*c, seq_len[s])).
#ifndef CHUNKATTN_KERNELS_API_CHUNK_CONTEXT_H_
#define CHUNKATTN_KERNELS_API_CHUNK_CONTEXT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace chunkattn {

// A KV copy a worker performs for copy-on-write: slots [0, num_tokens) of
// chunk `src` go to slots [0, num_tokens) of chunk `dst`, for every layer, K
// and V. Copies of a step are applied in the order given, before any KV write
// of that step (a chunk may be a copy source and be re-allocated later in the
// same step).
struct KvCopy {
  int32_t src_chunk = 0;
  int32_t dst_chunk = 0;
  int32_t num_tokens = 0;

  friend bool operator==(const KvCopy& a, const KvCopy& b) {
    return a.src_chunk == b.src_chunk && a.dst_chunk == b.dst_chunk &&
           a.num_tokens == b.num_tokens;
  }
};

// INVALID_ARGUMENT unless every copy's chunks are inside a pool of
// `num_pool_chunks` chunks and its token count in [0, chunk_size].
absl::Status ValidateKvCopies(absl::Span<const KvCopy> copies, int64_t num_pool_chunks, int chunk_size);

struct ChunkContext {
  int32_t chunk_size = 0;  // tokens per chunk (c)
  // Bumped whenever any chunk list, range or the sequence order changes (join,
  // leave, fork, chunk full, copy-on-write); not when tokens are only appended
  // into existing private tail chunks.
  uint64_t version = 0;

  // Per sequence, in context order.
  std::vector<int64_t> seq_ids;  // (num_seqs) forest sequence ids
  std::vector<int32_t> seq_len;  // (num_seqs) tokens with KV, updated every step

  // Shared chunks (j - i >= 2), in tree pre-order: a parent precedes its
  // children, so a chain of chunks with the same (i, j) is one run of entries.
  std::vector<int32_t> shared_chunk;   // (num_shared) chunk id C
  std::vector<int32_t> shared_begin;   // (num_shared) first sequence index i
  std::vector<int32_t> shared_end;     // (num_shared) one past the last, j
  std::vector<int32_t> shared_tokens;  // (num_shared) filled slots, 1..c

  // Private chunks of sequence s, in position order: entries
  // [private_begin[s], private_end[s]) of private_chunk / private_tokens.
  // Ranges never overlap but may leave unused entries between them, so a
  // sequence that grows a chunk is updated in place instead of shifting the
  // whole table (the builder leaves room and relocates a full range).
  std::vector<int32_t> private_begin;   // (num_seqs)
  std::vector<int32_t> private_end;     // (num_seqs)
  std::vector<int32_t> private_chunk;   // (table size) chunk id; -1 in unused entries
  std::vector<int32_t> private_tokens;  // (table size) filled slots, 1..c

  int num_seqs() const { return static_cast<int>(seq_ids.size()); }
  int num_shared() const { return static_cast<int>(shared_chunk.size()); }
};

// Checks every structural promise above: array sizes, ranges, chunk ids below
// `num_pool_chunks`, token counts consistent with seq_len, no chunk listed
// twice. O(num_shared * num_seqs) worst case: for plans received from the
// network and for tests, not for the per-step hot path.
absl::Status ValidateChunkContext(const ChunkContext& ctx, int64_t num_pool_chunks);

// The chunk ids of sequence `s` in position order (shared, then private).
// REQUIRES: 0 <= s < ctx.num_seqs().
std::vector<int32_t> SequenceChunks(const ChunkContext& ctx, int s);

}  // namespace chunkattn

#endif  // CHUNKATTN_KERNELS_API_CHUNK_CONTEXT_H_
