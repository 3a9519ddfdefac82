// Host memory owned with its own release, so one buffer type covers calloc
// and, on a GPU worker, page-locked memory from the CUDA driver (the KV
// tiers' slots: the device copies to and from them by DMA, with no staging
// copy through a driver buffer; workers/model/gpu_model.h).
#ifndef CHUNKATTN_BASE_HOST_MEMORY_H_
#define CHUNKATTN_BASE_HOST_MEMORY_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace chunkattn {

using HostBytes = std::unique_ptr<uint8_t, void (*)(uint8_t*)>;

// `bytes` (> 0) zeroed bytes. RESOURCE_EXHAUSTED when they cannot be had.
using HostAllocator = std::function<absl::StatusOr<HostBytes>(int64_t bytes)>;

// calloc: the kernel maps the pages only as they are first written.
inline absl::StatusOr<HostBytes> AllocateHostBytes(int64_t bytes) {
  void* p = bytes > 0 ? std::calloc(static_cast<size_t>(bytes), 1) : nullptr;
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat("cannot allocate %d bytes of host memory", bytes));
  }
  return HostBytes(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_HOST_MEMORY_H_
