#include "kernels/cuda/device.h"

#include <cstdio>

#include <cuda_runtime_api.h>

namespace chunkattn::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string DeviceDescription(int device) {
  cudaDeviceProp p{};
  const cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess) {
    cudaGetLastError();  // reported here; the next launch must not report it again
    return std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e);
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1 << 30));
  return buf;
}

}  // namespace chunkattn::cuda
