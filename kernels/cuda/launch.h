// Kernel launches of the CUDA attention, as plain C++ over device pointers:
// no Abseil, so nvcc compiles only this and the kernels. CudaAttention
// (cuda_attention.h) validates inputs, owns the buffers and turns the
// cudaError_t results into absl::Status.
//
// Every launch only enqueues work on `stream`, reads its sizes from device
// memory and uses a grid fixed per device, so a launch sequence can be
// captured once in a CUDA graph and replayed while the plan in the buffers
// changes.
#ifndef CHUNKATTN_KERNELS_CUDA_LAUNCH_H_
#define CHUNKATTN_KERNELS_CUDA_LAUNCH_H_

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/api/dtype.h"
#include "kernels/cuda/work.h"

namespace chunkattn::cuda {

// The attention kernel: a persistent grid walks the work items.
struct AttendParams {
  const WorkItem* items = nullptr;
  const int32_t* num_items = nullptr;  // device scalar
  const int32_t* table_chunk = nullptr;
  const int32_t* table_tokens = nullptr;
  const void* k = nullptr;  // one layer of the pool: (chunks, kv heads, chunk size, head dim)
  const void* v = nullptr;
  int num_kv_heads = 0;
  int chunk_size = 0;
  int log2_chunk = 0;
  int num_heads = 0;
  int group = 0;
  float scale_log2 = 0;  // softmax scale * log2(e)
  const void* q = nullptr;  // (token rows, num_heads, head dim), 16-byte aligned
  void* o = nullptr;
  float* part_o = nullptr;  // (slots, num_heads, head dim)
  float* part_m = nullptr;  // (slots, num_heads), natural-log units
  float* part_n = nullptr;
};

// Merges partial states into outputs (see DecodeWork's merge lists).
struct MergeParams {
  const int32_t* merge_seq = nullptr;
  const int32_t* merge_begin = nullptr;
  const int32_t* merge_slot = nullptr;
  const int32_t* num_merge = nullptr;  // device scalar
  const float* part_o = nullptr;
  const float* part_m = nullptr;
  const float* part_n = nullptr;
  void* o = nullptr;
  int num_heads = 0;
  int head_dim = 0;
};

// Writes new tokens' K/V rows into their pool slots; a slot < 0 is skipped.
struct AppendParams {
  const void* k = nullptr;  // (num_tokens, kv heads, head dim), 16-byte aligned
  const void* v = nullptr;
  const int64_t* slots = nullptr;  // device, (num_tokens)
  int num_tokens = 0;
  void* pool_k = nullptr;
  void* pool_v = nullptr;
  int num_kv_heads = 0;
  int chunk_size = 0;
  int row_bytes = 0;  // head dim x element bytes, a multiple of 16
};

// The kernels exist for fp16 and bf16 storage and head dims 64 and 128.
bool HasAttendKernel(DType dtype, int head_dim);

// Raises the kernel's dynamic shared memory limit and reports how many of its
// blocks one SM holds. Call before the first launch on a device.
cudaError_t PrepareAttendKernel(DType dtype, int head_dim, int* blocks_per_sm);

// The kernel lets a programmatic dependent (LaunchMerge) launch as soon as
// every block has started, so the merge blocks are resident when it drains.
cudaError_t LaunchAttend(const AttendParams& p, DType dtype, int head_dim, int grid, cudaStream_t stream);

// The compute capability (x10) of the merge kernel binary this device runs.
// Programmatic launches need 90 or more: only those binaries wait for the
// previous grid's memory in the kernel (a newer GPU may run the sm_80 build).
cudaError_t MergeKernelBinaryVersion(int* version);

// `programmatic`: launched as a programmatic dependent of the previous kernel
// on `stream` (it waits for that grid's memory in the kernel, not at launch).
cudaError_t LaunchMerge(const MergeParams& p, DType dtype, int grid, bool programmatic, cudaStream_t stream);

cudaError_t LaunchAppendKv(const AppendParams& p, cudaStream_t stream);

// The benchmark's naive baseline (the paper's "Naive"): every sequence has a
// dense copy of its KV, and the full score rows go through global memory.
struct NaiveParams {
  const void* k = nullptr;  // (num_seqs, kv heads, max_len, head dim)
  const void* v = nullptr;
  const int32_t* len = nullptr;  // device, (num_seqs)
  int num_seqs = 0;
  int max_len = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // <= 128
  float scale = 0;
  const void* q = nullptr;  // (num_seqs, num_heads, head dim)
  void* o = nullptr;
  float* scores = nullptr;  // (num_seqs, num_heads, max_len)
};
cudaError_t LaunchNaiveDecode(const NaiveParams& p, DType dtype, cudaStream_t stream);

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_LAUNCH_H_
