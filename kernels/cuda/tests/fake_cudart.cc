#include "kernels/cuda/tests/fake_cudart.h"

#include <cstring>

namespace chunkattn::testing {
namespace {

thread_local cudaError_t last_error = cudaSuccess;
int device_count = 0;

}  // namespace

void SetFakeDeviceCount(int n) { device_count = n; }

cudaError_t FakeFailedCall(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

}  // namespace chunkattn::testing

using chunkattn::testing::FakeFailedCall;

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = chunkattn::testing::last_error;
  chunkattn::testing::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return chunkattn::testing::last_error; }

const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }

const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "fake error"; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = chunkattn::testing::device_count;
  return *count > 0 ? cudaSuccess : FakeFailedCall(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= chunkattn::testing::device_count) return FakeFailedCall(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::strcpy(prop->name, "Fake GPU");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->totalGlobalMem = size_t{80} << 30;
  return cudaSuccess;
}

}  // extern "C"
