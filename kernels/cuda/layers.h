// The Llama decoder's layer primitives on the GPU, besides attention and the
// GEMMs: embedding lookup, residual add + RMSNorm, Qwen3's per-head q/k
// RMSNorm, RoPE + KV append, SwiGLU and sampling. Plain C++ over device
// pointers (no Abseil), like launch.h; the GPU model validates inputs and
// turns the results into absl::Status.
//
// Every call only enqueues work on `stream` (no allocation, no host sync,
// no state: callable from any thread), so a sequence of them can be captured
// in a CUDA graph. Each returns cudaErrorInvalidValue for an unsupported
// dtype, a bad size, or a null or misaligned pointer (nothing is launched
// then), else the launch's cudaGetLastError().
// rows == 0 is a no-op that returns cudaSuccess once the dtype and sizes check
// out (pointers are then not looked at).
//
// Storage type: `T` below is fp16 for DType::kFloat16 and bf16 for
// DType::kBFloat16; DType::kFloat32 is refused. All arithmetic is fp32, and
// every output is rounded once to its type (round to nearest even).
//
// Alignment: LaunchEmbed and LaunchAddRmsNorm need their row pointers 16-byte
// aligned (cudaMalloc gives 256; with hidden % 8 == 0 every row then is) and
// refuse others. The other calls use 16-byte (8 for 4 x T) accesses when their
// inner size is a multiple of the vector width and the pointers allow it, and
// scalar accesses otherwise. Rows are dense: the row stride is the width.
#ifndef CHUNKATTN_KERNELS_CUDA_LAYERS_H_
#define CHUNKATTN_KERNELS_CUDA_LAYERS_H_

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/api/dtype.h"
#include "kernels/cuda/rope_table.h"  // FillRopeTables, for the tables LaunchRopeAppend reads
#include "kernels/cuda/sample_row.h"  // SampleRowParams, the per-sample input of LaunchSample

namespace chunkattn {
struct KvPoolView;  // kernels/api/attention.h
}  // namespace chunkattn

namespace chunkattn::cuda {

// The largest `hidden` of LaunchAddRmsNorm (a row is held in registers).
inline constexpr int kMaxNormHidden = 16384;
// The largest vocabulary LaunchSample takes with a history (its bitmap of
// history tokens lives in shared memory: 32 KiB).
inline constexpr int kMaxPenaltyVocab = 1 << 18;

// x[r, :] = float(table[tokens[r], :]): the fp32 residual stream's first value.
//   table:  (vocab, hidden) of T
//   tokens: (rows) int32, on the device
//   x:      (rows, hidden) fp32
// REQUIRES: 0 <= tokens[r] < vocab (the host checked them); hidden % 8 == 0.
cudaError_t LaunchEmbed(DType dtype, const void* table, const int32_t* tokens, int64_t rows, int hidden, float* x,
                        cudaStream_t stream);

// Residual add, then RMSNorm (Hugging Face LlamaRMSNorm). For output row i,
// with r = gather ? gather[i] : i:
//   y = x[r, :] + (delta ? delta[r, :] : 0)
//   out[i, :] = T(weight[k] * (y[k] * inv)),  inv = 1 / sqrt(sum_k y[k]^2 / hidden + eps)
// which is the CPU model's formula in its operation order (only the sum's
// order differs). When delta != nullptr and gather == nullptr, y is also
// written back to x[r, :] (the residual stream moves on); with gather, x is
// left untouched and rows may repeat (the final norm of the logits rows).
//   x, delta: (rows of the residual stream, hidden) fp32
//   gather:   (rows) int32 row indices into x, or nullptr
//   weight:   (hidden) fp32
//   out:      (rows, hidden) of T; `rows` counts output rows
// REQUIRES: hidden % 8 == 0, hidden <= kMaxNormHidden; gather's indices in
// range (the host checked them); out does not overlap x or delta.
cudaError_t LaunchAddRmsNorm(DType dtype, float* x, const float* delta, const int32_t* gather, const float* weight,
                             int64_t rows, int hidden, float eps, void* out, cudaStream_t stream);

// Bias and per-head RMSNorm of q and k (Qwen3's q_norm / k_norm), in place
// on one layer's fused QKV projection, before LaunchRopeAppend (which then
// gets no bias: it was added here, before the norm as in transformers). For
// row r and head h (the q heads, then the k heads, then the v heads):
//   y = qkv[r, h, :] + (bias ? bias[h, :] : 0)
//   q and k heads: qkv[r, h, k] = w[k] * (y[k] * inv),
//                  inv = 1 / sqrt(sum_k y[k]^2 / head_dim + eps),
//                  w = q_weight for q heads, k_weight for k heads
//   v heads:       qkv[r, h, :] = y (untouched without a bias)
// which is the CPU model's formula in its operation order (only the sum's
// order differs).
//   qkv:      (rows, (num_heads + 2 * num_kv_heads) * head_dim) fp32
//   bias:     (that width) fp32, or nullptr
//   q_weight, k_weight: (head_dim) fp32, shared by every q (k) head
// One warp per head; fp32 only (no storage type).
// REQUIRES: 0 < head_dim <= 256.
cudaError_t LaunchQkNorm(float* qkv, const float* bias, const float* q_weight, const float* k_weight, int64_t rows,
                         int num_heads, int num_kv_heads, int head_dim, float eps, cudaStream_t stream);

// Bias, rotary embedding and the KV append of one layer's fused QKV
// projection. Per row r:
//   qkv:       (rows, (num_heads + 2 * num_kv_heads) * head_dim) fp32: the q
//              heads, then the k heads, then the v heads
//   bias:      (that width) fp32, added first; or nullptr
//   cos_table, sin_table: (max_positions, head_dim / 2) fp32 (FillRopeTables);
//              row r uses row positions[r]
//   positions: (rows) int32; slots: (rows) int64 flat pool slots
//   q_out:     (rows, num_heads, head_dim) of T
// Each q and k head is rotated in the "rotate_half" convention: for
// i < half = head_dim / 2, with a = v[i], b = v[i + half], c = cos[i],
// s = sin[i]: v[i] = a*c - b*s, v[i + half] = b*c + a*s. The q heads go to
// q_out; k (rotated) and v (not) go into the pool `kv` at slot slots[r]:
// chunk slots[r] / chunk_size, position slots[r] % chunk_size. A row with
// slots[r] < 0 (padding of a CUDA-graph batch bucket) writes no K/V, only q.
// REQUIRES: kv.dtype == dtype, kv.num_kv_heads == num_kv_heads,
// kv.head_dim == head_dim, kv.chunk_size a power of two; head_dim even and
// <= 256; 0 <= positions[r] < max_positions for every row, padding included;
// slots[r] < kv.num_chunks * kv.chunk_size (the host checked them).
// Vectorized (four dims per thread) when head_dim % 8 == 0.
cudaError_t LaunchRopeAppend(DType dtype, const float* qkv, const float* bias, const float* cos_table,
                             const float* sin_table, const int32_t* positions, const int64_t* slots, int64_t rows,
                             int num_heads, int num_kv_heads, int head_dim, const KvPoolView& kv, void* q_out,
                             cudaStream_t stream);

// out[r, i] = T(g / (1 + exp(-g)) * u), g = gate_up[r, i], u = gate_up[r, inter + i].
//   gate_up: (rows, 2 * inter) of T; out: (rows, inter) of T
// Vectorized (eight columns per thread) when inter % 8 == 0.
cudaError_t LaunchSwiGlu(DType dtype, const void* gate_up, int64_t rows, int inter, void* out, cudaStream_t stream);

// Greedy sampling with the CPU Sampler's semantics (temperature 0, no
// penalty). Per row of logits (rows, vocab) fp32, NaN counting as -inf:
//   token[r]   = the argmax, ties to the lowest token id
//   logprob[r] = log-softmax of the raw logits at that token:
//                logit - (max + log(sum over finite logits of exp(logit - max)))
// A row with a +inf logit, or with no finite logit, gets token -1 and logprob
// NaN (the host reports it as the Sampler's INVALID_ARGUMENT would).
//   token: (rows) int32; logprob: (rows) fp32
// REQUIRES: 0 < vocab <= 2^30. Loads are vectorized when vocab % 4 == 0.
cudaError_t LaunchGreedy(const float* logits, int64_t rows, int vocab, int32_t* token, float* logprob,
                         cudaStream_t stream);

// Sampling with the CPU Sampler's full semantics (token mask, temperature,
// top-k, top-p, min-p, repetition penalty, the seeded draw), one block per
// sample; the algorithm and its exactness are in sample_row.h. Samples may
// share a row.
//   logits:  (rows, vocab) fp32: logits rows row_offset ... row_offset + rows - 1
//   params:  (samples) on the device; params[s].row in [row_offset,
//            row_offset + rows)
//   history: the history tokens that params[s].history_begin/end index, on
//            the device; null when no sample has a penalty
//   masks:   the mask words that params[s].mask_begin/mask_words index, on
//            the device; null when no sample has a mask
//   token:   (samples) int32; -1 for a row with a +inf logit or no finite
//            logit among its allowed tokens (and for a sample breaking the
//            REQUIRES below on rows, history or masks)
//   logprob: (samples) fp32, the log-softmax at the token of the raw logits
//            with the disallowed tokens at -inf
// vocab <= kMaxSampleVocab (sample_row.h).
// REQUIRES: params valid (ValidateSamplingParams), history tokens in
// [0, vocab), history != nullptr if any penalty != 1 (then vocab <=
// kMaxPenaltyVocab), masks != nullptr if any mask_begin >= 0 (then
// mask_words <= (vocab + 31) / 32 and the words within the array), rows in
// range.
cudaError_t LaunchSample(const float* logits, int64_t rows, int vocab, int64_t row_offset,
                         const SampleRowParams* params, int64_t samples, const int32_t* history,
                         const uint32_t* masks, int32_t* token, float* logprob, cudaStream_t stream);

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_LAYERS_H_
