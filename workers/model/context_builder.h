// Builds a (C, i, j) ChunkContext from explicit per-sequence chunk paths, for
// callers that manage chunks themselves (tests, the offline generator) rather
// than through the coordinator's PrefixForest.
#ifndef CHUNKATTN_WORKERS_MODEL_CONTEXT_BUILDER_H_
#define CHUNKATTN_WORKERS_MODEL_CONTEXT_BUILDER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/api/chunk_context.h"

namespace chunkattn {

// `paths[s]` lists sequence s's chunk ids in position order and `seq_len[s]`
// its tokens; a chunk id that appears in several paths is shared (it must be
// at the same depth in each, and be full). Sequences must already be in an
// order where each shared chunk's sequences are contiguous (e.g. sorted by
// their paths). INVALID_ARGUMENT otherwise.
absl::StatusOr<ChunkContext> BuildChunkContext(const std::vector<std::vector<int32_t>>& paths,
                                               const std::vector<int32_t>& seq_len,
                                               int chunk_size, uint64_t version);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_CONTEXT_BUILDER_H_
