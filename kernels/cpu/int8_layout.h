// The int8 weight layout of the CPU decode kernel (cpu::WeightView::interleaved),
// for an (n, k) matrix with block 32, k a multiple of 256 and n of 4; other
// matrices keep row-major column order. Two levels:
//  * within every 256 columns (a span: 8 blocks of 32), memory holds for
//    v = 0..15 the column pairs (2v, 2v+1) of blocks 0..7 in turn. An integer
//    dot of 16 such columns (AVX2's vpmaddwd) then leaves in its lane m the
//    sum of block m alone, so 8 blocks are scaled by one vector multiply
//    instead of one scalar product and broadcast each (half the kernel's
//    instructions);
//  * rows in groups of 4, each group's 4 rows stored a span at a time in
//    turn (row 0's span 0, row 1's span 0, ..., row 3's, then row 0's span 1).
//    The kernel's tile of 4 weight rows then reads one sequential stream
//    instead of four a row apart, as packed_layout.h does for fp32 and 16-bit
//    rows: one core read int8 at 1.15x the speed (25 against 21 GB/s, and a
//    plain read of the same bytes 23-25).
// Scales are fp16, (n, k / 32) in column order (Int8Scale). Header-only: the
// model's loader and the ISA-specific kernel files share it.
#ifndef CHUNKATTN_KERNELS_CPU_INT8_LAYOUT_H_
#define CHUNKATTN_KERNELS_CPU_INT8_LAYOUT_H_

#include <cstdint>

#include "kernels/api/dtype.h"

namespace chunkattn::cpu {

// The fp16 scale of a block whose largest |w| is `amax`: the smallest half at
// least amax / 127 (fp16 rounds it up, never down, so every q = round(w /
// scale) stays within +-127), saturated at the largest finite half. Two bytes
// a block as llama.cpp's Q8_0, where fp32 scales cost 6% more bytes a decode
// step must stream. 0 for an all-zero block.
inline uint16_t Int8Scale(float amax) {
  const float want = amax / 127.0f;
  if (!(want > 0)) return 0;
  if (want >= 65504.0f) return 0x7bff;
  uint16_t h = FloatToHalf(want);
  if (HalfToFloat(h) < want) ++h;  // positive halves order as their bits
  return h;
}

inline constexpr int64_t kInt8InterleavedSpan = 256;
inline constexpr int64_t kInt8GroupRows = 4;

inline bool Int8Interleaves(int64_t n, int64_t k, int64_t block) {
  return block == 32 && k % kInt8InterleavedSpan == 0 && n % kInt8GroupRows == 0;
}

// Where column c of one row in span order is stored: the order of the
// activations the kernel dots the weights with (and, mod 256, of a stored
// span).
inline int64_t Int8InterleavedColumn(int64_t c) {
  const int64_t i = c % kInt8InterleavedSpan;
  return c - i + i % 32 / 2 * 16 + i / 32 * 2 + i % 2;
}

// Where span s (columns 256 s .. 256 s + 255) of row j starts.
inline int64_t Int8SpanOffset(int64_t j, int64_t s, int64_t k) {
  return (j - j % kInt8GroupRows) * k + (s * kInt8GroupRows + j % kInt8GroupRows) * kInt8InterleavedSpan;
}

// Where w(j, c) is stored.
inline int64_t Int8InterleavedIndex(int64_t j, int64_t c, int64_t k) {
  return Int8SpanOffset(j, c / kInt8InterleavedSpan, k) + Int8InterleavedColumn(c) % kInt8InterleavedSpan;
}

}  // namespace chunkattn::cpu

#endif  // CHUNKATTN_KERNELS_CPU_INT8_LAYOUT_H_
