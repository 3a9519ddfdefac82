// The unit of work of the CUDA attention kernel, and the index arithmetic the
// kernel and the host planner share. Plain structs and CHUNKATTN_HOST_DEVICE
// functions only: nvcc compiles this for the device, g++ for the planner and
// for the tests that execute plans on the CPU, so the mapping the kernel
// relies on is the mapping the tests check.
//
// One work item = one KV head, a list of consecutive entries of the chunk
// table (chunk ids and their filled slots), and up to kTileRows query rows
// that all attend over exactly that list:
//  * chunk-first (decode): the sequences [i, j) of a run of shared chunks,
//    times the GQA group; a long run may be cut into pieces along its chunks;
//  * sequence-first (decode): one sequence's group over its private chunks
//    (or, for the `seq` baseline, over all its chunks), possibly cut too;
//  * prefill: a block of new tokens of one sequence over the chunks up to the
//    last token's position, causal.
// Row r of an item is query head `kv_head * group + r % group` of token row
// `row0 + r / group` (a context sequence in decode, a q/o row in prefill).
#ifndef CHUNKATTN_KERNELS_CUDA_WORK_H_
#define CHUNKATTN_KERNELS_CUDA_WORK_H_

#include <cstdint>

#include "kernels/api/kv_layout.h"  // CHUNKATTN_HOST_DEVICE

namespace chunkattn::cuda {

inline constexpr int kWarps = 4;                   // warps per block
inline constexpr int kWarpRows = 16;               // query rows of one mma tile
inline constexpr int kTileRows = kWarps * kWarpRows;  // query rows per work item
inline constexpr int kStageTokens = 64;            // KV positions per pipeline stage

struct WorkItem {
  int32_t kv_head = 0;
  int32_t list = 0;        // first entry of the chunk table
  int32_t num_chunks = 0;  // entries from `list`, >= 1
  int32_t row0 = 0;        // first token row
  int32_t num_rows = 0;    // query rows, 1..kTileRows (whole groups)
  int32_t slot = -1;       // partial slot of token row 0; -1: write the normalized output
  int32_t pos0 = -1;       // causal: position of token row 0; -1: attend to the whole list
  int32_t pad = 0;
};
static_assert(sizeof(WorkItem) == 32, "WorkItem is uploaded as raw bytes");

// Where query row r of `w` reads q and writes its result.
struct RowRef {
  int64_t qo;       // element offset of the row in q and o: (token_row * num_heads + head) * head_dim
  int64_t partial;  // (slot + r / group) * num_heads + head; -1 when w.slot < 0
  int32_t pos;      // causal limit (attend to positions <= pos); INT32_MAX when not causal
};

CHUNKATTN_HOST_DEVICE inline RowRef MapRow(const WorkItem& w, int r, int group, int num_heads,
                                          int head_dim) {
  const int t = r / group;
  const int head = w.kv_head * group + r % group;
  RowRef ref;
  ref.qo = (int64_t{w.row0 + t} * num_heads + head) * head_dim;
  ref.partial = w.slot < 0 ? -1 : int64_t{w.slot + t} * num_heads + head;
  ref.pos = w.pos0 < 0 ? INT32_MAX : w.pos0 + t;
  return ref;
}

// Positions of an item's list: position p is slot p % c of list entry p / c
// (c a power of two). It holds a key when that slot is filled.
CHUNKATTN_HOST_DEVICE inline bool KeyAt(int32_t p, int log2_chunk, int num_chunks,
                                        const int32_t* list_tokens) {
  const int32_t e = p >> log2_chunk;
  return e < num_chunks && (p & ((1 << log2_chunk) - 1)) < list_tokens[e];
}

// One past the last position an item attends to: the last filled slot of its
// last chunk, or, causal, its last row's position if that comes first.
CHUNKATTN_HOST_DEVICE inline int32_t ItemEnd(const WorkItem& w, int chunk_size, int group,
                                             const int32_t* list_tokens) {
  const int32_t end = (w.num_chunks - 1) * chunk_size + list_tokens[w.num_chunks - 1];
  if (w.pos0 < 0) return end;
  const int32_t last = w.pos0 + (w.num_rows - 1) / group + 1;
  return last < end ? last : end;
}

// Warps of a block split an item's rows into `row_groups` tiles of 16 and
// each stage's KV positions into kWarps / row_groups parts, so an item of a
// few rows (sequence-first, one GQA group) still keeps every warp busy.
CHUNKATTN_HOST_DEVICE inline int RowGroups(int num_rows) {
  return num_rows <= kWarpRows ? 1 : num_rows <= 2 * kWarpRows ? 2 : 4;
}

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_WORK_H_
