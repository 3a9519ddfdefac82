// The float64 oracle: attention as the textbook formula,
//   softmax(scale * q K^T) V   over each sequence's full token list,
// reading K/V from the pool exactly as stored (so fp16/bf16 rounding of the
// inputs is shared with the kernels and only arithmetic error is compared).
// Deliberately the plainest code: no chunks, no online softmax, no threads.
#ifndef CHUNKATTN_KERNELS_CPU_REFERENCE_H_
#define CHUNKATTN_KERNELS_CPU_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"

namespace chunkattn::cpu {

// The attention state (o, m, n) of attention_state.h, in float64.
struct RefState {
  std::vector<double> o;
  double m = 0;
  double n = 0;
};

// State of query q (d values) over keys/values k, v: (len, d), len >= 1.
RefState ReferenceState(const double* q, const double* k, const double* v, int64_t len, int d, double scale);

// K and V of `kv_head` at positions [0, len) of a sequence whose chunks are
// `chunks` (position order), as float64 (len, head_dim).
void GatherPath(const KvPoolView& kv, const std::vector<int32_t>& chunks, int64_t len, int kv_head,
                std::vector<double>* k, std::vector<double>* v);

// Decode attention of every context sequence: (num_seqs, num_heads, head_dim).
std::vector<double> ReferenceDecode(const ChunkContext& ctx, const KvPoolView& kv, const AttentionShape& shape,
                                    const float* q);

// Prefill attention: (batch.num_tokens(), num_heads, head_dim).
std::vector<double> ReferencePrefill(const PrefillBatch& batch, const KvPoolView& kv, const AttentionShape& shape,
                                     const float* q);

}  // namespace chunkattn::cpu

#endif  // CHUNKATTN_KERNELS_CPU_REFERENCE_H_
