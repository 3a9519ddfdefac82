// The one conversion of CUDA runtime results to absl::Status. A failed call
// is converted here and its error cleared from the thread's last-error slot
// at once: left there, the next launch's cudaGetLastError() would report it
// and an unrelated kernel would take the blame. Errors that break the
// context (sticky ones, such as an illegal address) cannot be cleared: every
// later call reports them, as it should.
#ifndef CHUNKATTN_KERNELS_CUDA_CUDA_STATUS_H_
#define CHUNKATTN_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace chunkattn::cuda {

// OK; RESOURCE_EXHAUSTED for out of memory; else INTERNAL. Names `what`.
absl::Status CudaStatus(cudaError_t e, absl::string_view what);

}  // namespace chunkattn::cuda

#define CUDA_RETURN_IF_ERROR(expr) RETURN_IF_ERROR(::chunkattn::cuda::CudaStatus((expr), #expr))

#endif  // CHUNKATTN_KERNELS_CUDA_CUDA_STATUS_H_
