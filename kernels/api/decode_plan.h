// Decode planning shared by the CPU and CUDA attention: device-neutral, so
// the CUDA planner and the model need no CPU kernel for it.
#ifndef CHUNKATTN_KERNELS_API_DECODE_PLAN_H_
#define CHUNKATTN_KERNELS_API_DECODE_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/api/chunk_context.h"

namespace chunkattn {

// kTpp: two-phase partition (chunk-first over shared runs, then
// sequence-first); kSequence: every sequence reads all its chunks itself
// (the paper's PagedAttention* baseline).
enum class DecodeImpl { kTpp, kSequence };
const char* DecodeImplName(DecodeImpl impl);

// What the kernels need from a context's structure, derived once per context
// version (the "plan" step; the per-step "run" only reads token counts).
struct DecodePlan {
  uint64_t version = 0;
  int num_seqs = 0;
  int num_shared = 0;
  int table_size = 0;  // entries in the private table
  // A run: shared entries [first, last) that all cover sequences [begin, end).
  // Its partial state for sequence s lives in partial slot `slot + s - begin`.
  struct Run {
    int32_t first = 0, last = 0, begin = 0, end = 0, slot = 0;
  };
  std::vector<Run> runs;
  // Runs covering sequence s: seq_runs[seq_run_begin[s] .. seq_run_begin[s+1]).
  std::vector<int32_t> seq_run_begin;
  std::vector<int32_t> seq_runs;
  int64_t num_slots = 0;  // sum of (end - begin) over runs
};

// INVALID_ARGUMENT when the arrays are inconsistent (sizes, ranges, chunk ids
// outside [0, num_pool_chunks)). O(entries + sum of run widths); the deeper
// promises are ValidateChunkContext's, checked where plans enter a worker.
absl::StatusOr<DecodePlan> PlanDecode(const ChunkContext& ctx, int64_t num_pool_chunks);

}  // namespace chunkattn

#endif  // CHUNKATTN_KERNELS_API_DECODE_PLAN_H_
