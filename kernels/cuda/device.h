// CUDA device discovery: host code, free of Abseil.
#ifndef CHUNKATTN_KERNELS_CUDA_DEVICE_H_
#define CHUNKATTN_KERNELS_CUDA_DEVICE_H_

#include <string>

namespace chunkattn::cuda {

// Visible CUDA devices; 0 when there is no driver or no GPU (not an error:
// the CPU path is always available).
int DeviceCount();

// "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB", or the CUDA error text
// (then cleared: the thread's last error stays cudaSuccess).
std::string DeviceDescription(int device);

}  // namespace chunkattn::cuda

#endif  // CHUNKATTN_KERNELS_CUDA_DEVICE_H_
