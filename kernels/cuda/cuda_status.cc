#include "kernels/cuda/cuda_status.h"

#include "absl/strings/str_format.h"

namespace chunkattn::cuda {

absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // the caller reports it; no later call may report it again
  const std::string message = absl::StrFormat("%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace chunkattn::cuda
