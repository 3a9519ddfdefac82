// The per-span setup every ISA's interleaved int8 tile shares (int8_layout.h).
// In an anonymous namespace, as simd_avx2.h, so each ISA's translation unit
// compiles its own copy under its own flags.
#ifndef CHUNKATTN_KERNELS_CPU_INTERNAL_INT8_TILE_H_
#define CHUNKATTN_KERNELS_CPU_INTERNAL_INT8_TILE_H_

#include <cstdint>

#include "kernels/cpu/int8_layout.h"

namespace chunkattn::cpu::internal {
namespace {

// row[j] = where span `sp` of weight row j0 + j starts, for the tile's J rows,
// after prefetching the same span of the rows two tiles on and their scales:
// the tile streams its own rows meanwhile, and its integer dots fill the
// out-of-order window, which leaves few loads in flight (1.1x at distance 1
// and 1.1x more at 2, int8 at batch 1 on the 156M model; 4 no better).
template <int J>
void Int8TileSpan(const int8_t* w, const uint16_t* scales, int64_t j0, int64_t sp, int64_t k, const int8_t* (&row)[J]) {
  const int64_t ng = k / 32;
  for (int j = 0; j < J; ++j) {
    const int8_t* ahead = w + Int8SpanOffset(j0 + 2 * J + j, sp, k);
    for (int64_t l = 0; l < kInt8InterleavedSpan; l += 64) __builtin_prefetch(ahead + l);
    __builtin_prefetch(scales + (j0 + 2 * J + j) * ng + sp * 8);
    row[j] = w + Int8SpanOffset(j0 + j, sp, k);
  }
}

}  // namespace
}  // namespace chunkattn::cpu::internal

#endif  // CHUNKATTN_KERNELS_CPU_INTERNAL_INT8_TILE_H_
