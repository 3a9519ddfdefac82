// The rotary-embedding tables the GPU model uploads once (LaunchRopeAppend in
// layers.h reads them). Plain host C++, no CUDA: built into
// chunkattn_kernels_cuda_plan so it is tested on every machine.
#ifndef CHUNKATTN_KERNELS_CUDA_ROPE_TABLE_H_
#define CHUNKATTN_KERNELS_CUDA_ROPE_TABLE_H_

namespace chunkattn::cuda {

// Fills rows [0, max_positions) of the cos and sin tables:
//   inv_freq:             (half) fp32 inverse frequencies (RopeInverseFrequencies)
//   cos_table, sin_table: (max_positions, half) fp32, row = token position
// with exactly the CPU model's (workers/model/llama.cc) values: the angle is
// the fp32 product float(pos) * inv_freq[i], as in transformers, and its
// cosine and sine are taken in double and rounded once to fp32. Bit-equal
// tables make the GPU's rotation operands the CPU's.
void FillRopeTables(const float* inv_freq, int half, int max_positions, float* cos_table, float* sin_table);

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_ROPE_TABLE_H_
