// The host arithmetic of the CUDA model (declared in cuda_llama.h), built
// with or without CUDA so it is tested everywhere.
#include "workers/model/cuda_llama.h"

namespace chunkattn {

int GraphBucket(int n) {
  if (n < 1) return 0;
  if (n <= 16) {
    int b = 1;
    while (b < n) b *= 2;
    return b;
  }
  return (n + 15) / 16 * 16;
}

int64_t KvChunksForMemory(int64_t free_bytes, int64_t total_bytes, double fraction,
                          int64_t reserve_bytes, int64_t chunk_bytes) {
  if (chunk_bytes <= 0 || !(fraction > 0 && fraction <= 1)) return 0;
  const double keep_free = (1.0 - fraction) * static_cast<double>(total_bytes);
  const double usable = static_cast<double>(free_bytes) - keep_free - static_cast<double>(reserve_bytes);
  if (usable < static_cast<double>(chunk_bytes)) return 0;
  return static_cast<int64_t>(usable / static_cast<double>(chunk_bytes));
}

}  // namespace chunkattn
