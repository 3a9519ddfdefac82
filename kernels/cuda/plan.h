// Host-side planning of the CUDA attention kernels: turns a (C, i, j)
// context (decode) or a prefill batch into WorkItems, the chunk table they
// index and, for decode, which partial states merge into which output.
// Plain C++, always built (also without nvcc): the tests execute plans on
// the CPU against the float64 oracle, so everything but the device
// arithmetic is covered on machines without a GPU.
//
// Decode (made once per context version; a step then only refreshes the
// filled-slot counts with FillTokens):
//  * tpp: a chunk-first item per (run of shared chunks with the same [i, j),
//    KV head, tile of kTileRows rows), writing one fp32 partial state per
//    (sequence, head, piece); a sequence-first item per (sequence, KV head)
//    over its private chunks. A sequence whose only item is its own
//    sequence-first one writes its output directly; every other sequence's
//    partials are merged by the merge kernel.
//  * seq (the paper's PagedAttention*): a sequence-first item per (sequence,
//    KV head) over all its chunks, shared ones included.
// Lists longer than a balanced share of the work are cut into pieces
// (split-KV), so small batches, long tails and long shared runs still fill
// the GPU.
#ifndef CHUNKATTN_KERNELS_CUDA_PLAN_H_
#define CHUNKATTN_KERNELS_CUDA_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"
#include "kernels/api/decode_plan.h"
#include "kernels/cuda/work.h"

namespace chunkattn::cuda {

struct PlanOptions {
  // Items the GPU runs at once (SMs x resident blocks per SM). A list longer
  // than the work's share of twice this many items is cut into pieces. 0
  // disables splitting.
  int concurrent_items = 0;
  // A piece never holds fewer KV positions than this (the fixed cost of an
  // item and of merging its partial state must stay small).
  int min_piece_tokens = 256;
};

struct DecodeWork {
  uint64_t version = 0;
  DecodeImpl impl = DecodeImpl::kTpp;
  int num_seqs = 0;
  int num_shared = 0;
  int table_size = 0;  // entries of the context's private table
  int num_heads = 0;
  int group = 0;
  int chunk_size = 0;
  std::vector<WorkItem> items;  // heaviest first
  // The chunk table the items index: chunk ids, and for each entry the
  // context entry whose filled-slot count it mirrors (k >= 0: shared entry k;
  // ~i: private table entry i).
  std::vector<int32_t> table_chunk;
  std::vector<int32_t> table_src;
  int64_t num_slots = 0;  // partial states per head
  // Outputs assembled by the merge kernel: sequence merge_seq[i] merges the
  // partial slots merge_slot[merge_begin[i] .. merge_begin[i+1]) of each head.
  std::vector<int32_t> merge_seq;
  std::vector<int32_t> merge_begin;
  std::vector<int32_t> merge_slot;
  int max_merge = 0;  // most partial states merged into one output
};

// INVALID_ARGUMENT for an inconsistent context (PlanDecode's checks) or
// a GQA group over kTileRows.
absl::StatusOr<DecodeWork> PlanDecodeWork(DecodeImpl impl, const ChunkContext& ctx, int64_t num_pool_chunks,
                                          const AttentionShape& shape, const PlanOptions& options);

// Upper bounds on a decode plan's arrays, over every context of at most
// `max_seqs` sequences whose paths hold at most `max_seq_chunks` chunks each
// and whose sharing forms a forest (the readers of nested chunks form nested
// ranges, as PrefixForest makes them), planned with `options`. CudaAttention
// sizes its decode buffers with these once, so the buffers a captured graph
// reads are never reallocated.
//
// Why they hold (tpp; seq has no shared lists): the table lists each chunk
// of the sequences' paths at most once (<= max_seqs * max_seq_chunks). A run
// of shared chunks reads a distinct range of >= 2 sequences, and along one
// path the ranges shrink strictly, so a sequence reads at most
// min(max_seq_chunks, max_seqs - 1) runs and the forest has at most
// max_seqs - 1 runs. Unsplit, a list of r rows makes ceil(r / tile) tiles per
// KV head and one partial slot per row; split-KV cuts a list of n chunks into
// at most n / share + 1 pieces with share >= (all tiles' chunk reads) /
// (2 * concurrent_items), which adds at most 2 * concurrent_items items and
// tile * 2 * concurrent_items / kv_heads slots.
struct DecodeWorkBounds {
  int64_t items = 0;
  int64_t table = 0;        // chunk-table entries
  int64_t merge_seqs = 0;   // merge_seq entries; merge_begin holds one more
  int64_t merge_slots = 0;  // merge_slot entries
  int64_t slots = 0;        // partial states per head
};
DecodeWorkBounds BoundDecodeWork(DecodeImpl impl, int max_seqs, int max_seq_chunks, const AttentionShape& shape,
                                 const PlanOptions& options);

// The filled slots of every chunk-table entry for this step's context (same
// version as `work`): tokens.size() == work.table_chunk.size().
// FAILED_PRECONDITION when the context is of another version or shape, and
// INVALID_ARGUMENT when a count is outside [1, chunk_size].
absl::Status FillTokens(const DecodeWork& work, const ChunkContext& ctx, std::vector<int32_t>* tokens);

struct PrefillWork {
  int group = 0;
  int chunk_size = 0;
  std::vector<WorkItem> items;        // heaviest first
  std::vector<int32_t> table_chunk;   // batch.chunk_ids
  std::vector<int32_t> table_tokens;  // filled slots of each, 0 past the sequence's end
};

// INVALID_ARGUMENT for an inconsistent batch (ValidatePrefillBatch) or a GQA
// group over kTileRows.
absl::StatusOr<PrefillWork> PlanPrefillWork(const PrefillBatch& batch, int chunk_size, int64_t num_pool_chunks,
                                            const AttentionShape& shape);

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_PLAN_H_
