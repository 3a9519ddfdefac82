// Warp- and block-wide reductions shared by the layer and sampling kernels.
// nvcc only. The block versions need blockDim.x a multiple of 32 and give
// every thread the same bits; their `smem` (32 values) may be reused only
// after a __syncthreads() that follows every thread's return.
#ifndef CHUNKATTN_KERNELS_CUDA_WARP_REDUCE_CUH_
#define CHUNKATTN_KERNELS_CUDA_WARP_REDUCE_CUH_

#include <climits>
#include <cmath>

namespace chunkattn::cuda {

template <typename V>
__device__ __forceinline__ V WarpSum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename V>
__device__ __forceinline__ V BlockSum(V v, V* smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = WarpSum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  return WarpSum(lane < static_cast<int>(blockDim.x >> 5) ? smem[lane] : V(0));
}

// Max of values that are never NaN.
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float BlockMax(float v, float* smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = WarpMax(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  return WarpMax(lane < static_cast<int>(blockDim.x >> 5) ? smem[lane] : -INFINITY);
}

// (v, id) <- the larger value, the lower id on equal values.
__device__ __forceinline__ void ArgMaxMerge(float& v, int& id, float v2, int id2) {
  if (v2 > v || (v2 == v && id2 < id)) {
    v = v2;
    id = id2;
  }
}

__device__ __forceinline__ void WarpArgMax(float& v, int& id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int id2 = __shfl_xor_sync(0xffffffffu, id, o);
    ArgMaxMerge(v, id, v2, id2);
  }
}

// The block's ArgMaxMerge of every thread's (v, id), in every thread.
__device__ __forceinline__ void BlockArgMax(float& v, int& id, float* smem_v, int* smem_id) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  WarpArgMax(v, id);
  if (lane == 0) {
    smem_v[warp] = v;
    smem_id[warp] = id;
  }
  __syncthreads();
  if (lane < static_cast<int>(blockDim.x >> 5)) {
    v = smem_v[lane];
    id = smem_id[lane];
  } else {
    v = -INFINITY;
    id = INT_MAX;
  }
  WarpArgMax(v, id);
}

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_WARP_REDUCE_CUH_
