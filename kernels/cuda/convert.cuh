// fp16 / bf16 <-> fp32 on the device, for the kernels' templates over the
// storage type T (__half or __nv_bfloat16). nvcc only.
#ifndef CHUNKATTN_KERNELS_CUDA_CONVERT_CUH_
#define CHUNKATTN_KERNELS_CUDA_CONVERT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace chunkattn::cuda {

template <typename T>
__device__ __forceinline__ float ToFloat(T x);
template <>
__device__ __forceinline__ float ToFloat(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// Round to nearest even.
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_CONVERT_CUH_
