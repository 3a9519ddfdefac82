// A stand-in for the few CUDA runtime calls that device.cc and cuda_status.cc
// make, keeping the runtime's documented last-error semantics: a failed call
// records its error in a per-thread slot that cudaPeekAtLastError reads and
// cudaGetLastError reads and resets. Linked instead of cudart by
// chunkattn_cuda_errors_test only.
#ifndef CHUNKATTN_KERNELS_CUDA_TESTS_FAKE_CUDART_H_
#define CHUNKATTN_KERNELS_CUDA_TESTS_FAKE_CUDART_H_

#include <cuda_runtime_api.h>

namespace chunkattn::testing {

// Devices the stand-in reports (0: cudaGetDeviceCount fails with
// cudaErrorNoDevice, as the real runtime does without a GPU).
void SetFakeDeviceCount(int n);

// A failed call of the stand-in: records `e` in the slot and returns it,
// as a real failing call or launch does.
cudaError_t FakeFailedCall(cudaError_t e);

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_KERNELS_CUDA_TESTS_FAKE_CUDART_H_
