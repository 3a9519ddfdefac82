#include "workers/model/context_builder.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace chunkattn {

absl::StatusOr<ChunkContext> BuildChunkContext(const std::vector<std::vector<int32_t>>& paths,
                                               const std::vector<int32_t>& seq_len,
                                               int chunk_size, uint64_t version) {
  const int n = static_cast<int>(paths.size());
  if (static_cast<int>(seq_len.size()) != n || chunk_size < 1) {
    return absl::InvalidArgumentError("BuildChunkContext: one seq_len per path, chunk_size > 0");
  }
  struct Use {
    int depth = -1, begin = 0, end = 0, count = 0;
  };
  std::map<int32_t, Use> uses;
  for (int s = 0; s < n; ++s) {
    const int64_t need = (int64_t{seq_len[s]} + chunk_size - 1) / chunk_size;
    if (seq_len[s] < 1 || static_cast<int64_t>(paths[s].size()) != need) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: %d tokens need %d chunks, the path has %d", s, seq_len[s], need,
          paths[s].size()));
    }
    for (int depth = 0; depth < static_cast<int>(paths[s].size()); ++depth) {
      Use& u = uses[paths[s][depth]];
      if (u.count == 0) {
        u = {depth, s, s + 1, 1};
        continue;
      }
      if (u.depth != depth || u.end != s) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "chunk %d: shared at different depths or by non-contiguous sequences",
            paths[s][depth]));
      }
      u.end = s + 1;
      ++u.count;
    }
  }
  ChunkContext ctx;
  ctx.chunk_size = chunk_size;
  ctx.version = version;
  for (int s = 0; s < n; ++s) ctx.seq_ids.push_back(s);
  ctx.seq_len = seq_len;
  // Tree pre-order is (first sequence, depth) order: same-begin shared chunks
  // are ancestors of one another, and disjoint ranges come in sequence order.
  std::vector<std::tuple<int, int, int32_t>> shared;
  for (const auto& [chunk, u] : uses) {
    if (u.count >= 2) shared.emplace_back(u.begin, u.depth, chunk);
  }
  std::sort(shared.begin(), shared.end());
  for (const auto& [begin, depth, chunk] : shared) {
    const Use& u = uses[chunk];
    for (int s = u.begin; s < u.end; ++s) {
      if (seq_len[s] < (depth + 1) * chunk_size) {
        return absl::InvalidArgumentError(
            absl::StrFormat("shared chunk %d is not full for sequence %d", chunk, s));
      }
    }
    ctx.shared_chunk.push_back(chunk);
    ctx.shared_begin.push_back(u.begin);
    ctx.shared_end.push_back(u.end);
    ctx.shared_tokens.push_back(chunk_size);
  }
  for (int s = 0; s < n; ++s) {
    ctx.private_begin.push_back(static_cast<int32_t>(ctx.private_chunk.size()));
    for (int depth = 0; depth < static_cast<int>(paths[s].size()); ++depth) {
      const Use& u = uses[paths[s][depth]];
      if (u.count >= 2) {
        if (static_cast<int>(ctx.private_chunk.size()) != ctx.private_begin[s]) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "sequence %d: a shared chunk follows a private one", s));
        }
        continue;
      }
      ctx.private_chunk.push_back(paths[s][depth]);
      ctx.private_tokens.push_back(std::min(chunk_size, seq_len[s] - depth * chunk_size));
    }
    ctx.private_end.push_back(static_cast<int32_t>(ctx.private_chunk.size()));
  }
  return ctx;
}

}  // namespace chunkattn
