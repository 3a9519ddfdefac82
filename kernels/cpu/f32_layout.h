// The fp32 weight layout of the CPU decode kernel (cpu::WeightView::packed):
// rows in groups of 4, each group's 4 rows stored 8 columns at a time in
// turn (row 0's columns 0-7, row 1's 0-7, ..., row 3's, then row 0's 8-15).
// The kernel's tile of 4 weight rows then reads one sequential stream
// instead of four 4 KiB apart: one core streams 1.2x faster on the 2-core
// VM (a 23 MB matrix, 1 thread: 24 to 30 GB/s), with the same FMAs in the
// same order, so results are bit for bit those of row-major weights. For n
// % 4 == 0 and k % 8 == 0. Header-only: the model and the kernels share it.
#ifndef CHUNKATTN_KERNELS_CPU_F32_LAYOUT_H_
#define CHUNKATTN_KERNELS_CPU_F32_LAYOUT_H_

#include <cstdint>

namespace chunkattn::cpu {

inline constexpr int64_t kF32PackRows = 4;
inline constexpr int64_t kF32PackCols = 8;

inline bool F32Packs(int64_t n, int64_t k) { return n % kF32PackRows == 0 && k % kF32PackCols == 0; }

// Where w(j, i) of a packed (n, k) matrix is stored.
inline int64_t F32PackedIndex(int64_t j, int64_t i, int64_t k) {
  return (j - j % kF32PackRows) * k + (i - i % kF32PackCols) * kF32PackRows + j % kF32PackRows * kF32PackCols +
         i % kF32PackCols;
}

// Rows [r0, r0 + n) of a packed (.., k) matrix between `packed` and
// row-major `flat` (n, k): packing, and reading rows back.
inline void PackF32Rows(const float* flat, int64_t r0, int64_t n, int64_t k, float* packed) {
  for (int64_t r = r0; r < r0 + n; ++r) {
    for (int64_t i = 0; i < k; i += kF32PackCols) {
      for (int64_t l = 0; l < kF32PackCols; ++l) packed[F32PackedIndex(r, i, k) + l] = flat[(r - r0) * k + i + l];
    }
  }
}
inline void UnpackF32Rows(const float* packed, int64_t r0, int64_t n, int64_t k, float* flat) {
  for (int64_t r = r0; r < r0 + n; ++r) {
    for (int64_t i = 0; i < k; i += kF32PackCols) {
      for (int64_t l = 0; l < kF32PackCols; ++l) flat[(r - r0) * k + i + l] = packed[F32PackedIndex(r, i, k) + l];
    }
  }
}

}  // namespace chunkattn::cpu

#endif  // CHUNKATTN_KERNELS_CPU_F32_LAYOUT_H_
