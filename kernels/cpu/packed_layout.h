// The packed weight layout of the CPU decode kernel (cpu::WeightView::packed),
// for fp32, fp16 and bf16 rows: rows in groups of 4, each group's 4 rows
// stored 8 columns at a time in turn (row 0's columns 0-7, row 1's 0-7, ...,
// row 3's, then row 0's 8-15). The kernel's tile of 4 weight rows then reads
// one sequential stream instead of four a row apart, which one core's
// prefetchers follow much better (one thread on the 2-core VM: fp32 24 to
// 30 GB/s; fp16 18 to 29 GB/s against row-major with software prefetch),
// with the same FMAs in the same order, so results are bit for bit those of
// row-major weights. For n % 4 == 0 and k % 8 == 0. Header-only: the model
// and the kernels share it.
#ifndef CHUNKATTN_KERNELS_CPU_PACKED_LAYOUT_H_
#define CHUNKATTN_KERNELS_CPU_PACKED_LAYOUT_H_

#include <cstdint>

namespace chunkattn::cpu {

inline constexpr int64_t kPackRows = 4;
inline constexpr int64_t kPackCols = 8;

inline bool Packs(int64_t n, int64_t k) { return n % kPackRows == 0 && k % kPackCols == 0; }

// Where w(j, i) of a packed (n, k) matrix is stored; w(j, i .. i + 7) are
// contiguous from there when i % 8 == 0.
inline int64_t PackedIndex(int64_t j, int64_t i, int64_t k) {
  return (j - j % kPackRows) * k + (i - i % kPackCols) * kPackRows + j % kPackRows * kPackCols + i % kPackCols;
}

// Rows [r0, r0 + n) of a packed (.., k) matrix between `packed` and
// row-major `flat` (n, k): packing, and reading rows back.
template <class T>
void PackRows(const T* flat, int64_t r0, int64_t n, int64_t k, T* packed) {
  for (int64_t r = r0; r < r0 + n; ++r) {
    for (int64_t i = 0; i < k; i += kPackCols) {
      for (int64_t l = 0; l < kPackCols; ++l) packed[PackedIndex(r, i, k) + l] = flat[(r - r0) * k + i + l];
    }
  }
}
template <class T>
void UnpackRows(const T* packed, int64_t r0, int64_t n, int64_t k, T* flat) {
  for (int64_t r = r0; r < r0 + n; ++r) {
    for (int64_t i = 0; i < k; i += kPackCols) {
      for (int64_t l = 0; l < kPackCols; ++l) flat[(r - r0) * k + i + l] = packed[PackedIndex(r, i, k) + l];
    }
  }
}

}  // namespace chunkattn::cpu

#endif  // CHUNKATTN_KERNELS_CPU_PACKED_LAYOUT_H_
