#include "kernels/api/chunk_context.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "kernels/api/kv_layout.h"

namespace chunkattn {

std::vector<int32_t> SequenceChunks(const ChunkContext& ctx, int s) {
  std::vector<int32_t> path;
  for (int k = 0; k < ctx.num_shared(); ++k) {
    if (ctx.shared_begin[k] <= s && s < ctx.shared_end[k]) path.push_back(ctx.shared_chunk[k]);
  }
  path.insert(path.end(), ctx.private_chunk.begin() + ctx.private_begin[s],
              ctx.private_chunk.begin() + ctx.private_end[s]);
  return path;
}

absl::Status ValidateKvCopies(absl::Span<const KvCopy> copies, int64_t num_pool_chunks, int chunk_size) {
  for (const KvCopy& c : copies) {
    if (c.src_chunk < 0 || c.src_chunk >= num_pool_chunks || c.dst_chunk < 0 || c.dst_chunk >= num_pool_chunks ||
        c.num_tokens < 0 || c.num_tokens > chunk_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "KV copy %d -> %d of %d tokens is outside the pool (%d chunks of %d tokens)", c.src_chunk, c.dst_chunk,
          c.num_tokens, num_pool_chunks, chunk_size));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateChunkContext(const ChunkContext& ctx, int64_t num_pool_chunks) {
  const int c = ctx.chunk_size;
  if (!IsValidChunkSize(c)) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk_size %d is not a power of two in [%d, %d]",
                                                      c, kMinChunkSize, kMaxChunkSize));
  }
  const int n = ctx.num_seqs();
  if (ctx.seq_len.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError("seq_len and seq_ids differ in length");
  }
  const size_t ns = ctx.shared_chunk.size();
  if (ctx.shared_begin.size() != ns || ctx.shared_end.size() != ns || ctx.shared_tokens.size() != ns) {
    return absl::InvalidArgumentError("shared_* arrays differ in length");
  }
  if (ctx.private_begin.size() != static_cast<size_t>(n) || ctx.private_end.size() != static_cast<size_t>(n) ||
      ctx.private_tokens.size() != ctx.private_chunk.size()) {
    return absl::InvalidArgumentError("private_* arrays differ in length");
  }
  // Ranges must lie inside the table and not overlap.
  std::vector<std::pair<int32_t, int32_t>> ranges;
  for (int s = 0; s < n; ++s) {
    const int32_t b = ctx.private_begin[s], e = ctx.private_end[s];
    if (b < 0 || e < b || e > static_cast<int64_t>(ctx.private_chunk.size())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sequence %d: private range [%d, %d) outside the table", s, b, e));
    }
    if (e > b) ranges.emplace_back(b, e);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t r = 1; r < ranges.size(); ++r) {
    if (ranges[r].first < ranges[r - 1].second) {
      return absl::InvalidArgumentError("private ranges overlap");
    }
  }
  absl::flat_hash_set<int32_t> seen;
  auto check_chunk = [&](int32_t chunk, int32_t tokens) -> absl::Status {
    if (chunk < 0 || chunk >= num_pool_chunks) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chunk id %d outside the pool of %d", chunk, num_pool_chunks));
    }
    if (tokens < 1 || tokens > c) {
      return absl::InvalidArgumentError(absl::StrFormat("chunk %d holds %d tokens", chunk, tokens));
    }
    if (!seen.insert(chunk).second) {
      return absl::InvalidArgumentError(absl::StrFormat("chunk %d listed twice", chunk));
    }
    return absl::OkStatus();
  };
  // Per sequence: chunks seen so far (shared ones first), and whether a
  // partially filled chunk has already ended its path.
  std::vector<int32_t> depth(n, 0);
  std::vector<int32_t> tail_tokens(n, c);
  for (size_t k = 0; k < ns; ++k) {
    const int32_t i = ctx.shared_begin[k], j = ctx.shared_end[k];
    if (i < 0 || j > n || j - i < 2) {
      return absl::InvalidArgumentError(absl::StrFormat("shared chunk %d has range [%d, %d) of %d sequences",
                                                        ctx.shared_chunk[k], i, j, n));
    }
    if (absl::Status s = check_chunk(ctx.shared_chunk[k], ctx.shared_tokens[k]); !s.ok()) return s;
    const int32_t d = depth[i];
    for (int s = i; s < j; ++s) {
      // One position per chunk: every reader reaches it at the same depth
      // (which also makes the ranges of a path nested).
      if (depth[s] != d) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "shared chunk %d is chunk %d of sequence %d but chunk %d of sequence %d", ctx.shared_chunk[k], d,
            i, depth[s], s));
      }
      if (tail_tokens[s] != c) {
        return absl::InvalidArgumentError(absl::StrFormat("sequence %d continues past a partial chunk", s));
      }
      ++depth[s];
      tail_tokens[s] = ctx.shared_tokens[k];
    }
  }
  for (int s = 0; s < n; ++s) {
    const int32_t begin = ctx.private_begin[s], end = ctx.private_end[s];
    for (int32_t p = begin; p < end; ++p) {
      if (absl::Status st = check_chunk(ctx.private_chunk[p], ctx.private_tokens[p]); !st.ok()) return st;
      if (tail_tokens[s] != c) {
        return absl::InvalidArgumentError(absl::StrFormat("sequence %d continues past a partial chunk", s));
      }
      ++depth[s];
      tail_tokens[s] = ctx.private_tokens[p];
    }
    const int64_t expected = depth[s] == 0 ? 0 : int64_t{depth[s] - 1} * c + tail_tokens[s];
    if (depth[s] == 0 || ctx.seq_len[s] != expected) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: seq_len %d but its %d chunks hold %d tokens", s, ctx.seq_len[s], depth[s], expected));
    }
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
