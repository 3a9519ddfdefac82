// The int8 weight layout of the CPU decode kernel (cpu::WeightView::interleaved):
// within every 256 columns (8 blocks of 32), memory holds for v = 0..15 the
// column pairs (2v, 2v+1) of blocks 0..7 in turn. An integer dot of 16 such
// columns (AVX2's vpmaddwd) then leaves in its lane m the sum of block m
// alone, so 8 blocks are scaled by one vector multiply instead of one scalar
// product and broadcast each (half the kernel's instructions). For block 32
// and k a multiple of 256; other rows keep column order. Header-only: the
// model's loader and the ISA-specific kernel files share it.
#ifndef CHUNKATTN_KERNELS_CPU_INT8_LAYOUT_H_
#define CHUNKATTN_KERNELS_CPU_INT8_LAYOUT_H_

#include <cstdint>

namespace chunkattn::cpu {

inline constexpr int64_t kInt8InterleavedSpan = 256;

inline bool Int8Interleaves(int64_t k, int64_t block) { return block == 32 && k % kInt8InterleavedSpan == 0; }

// Where column c of an interleaved row is stored.
inline int64_t Int8InterleavedColumn(int64_t c) {
  const int64_t i = c % kInt8InterleavedSpan;
  return c - i + (i % 32) / 2 * 16 + i / 32 * 2 + i % 2;
}

}  // namespace chunkattn::cpu

#endif  // CHUNKATTN_KERNELS_CPU_INT8_LAYOUT_H_
