// The AVX-512 (F, BW, VL, VNNI) decode Linear kernels: the AVX2 tables with
// `linear` and `linear_q8` replaced where the weights are in the model's
// layouts (packed fp32/fp16/bf16 from 3 rows on, interleaved int8); every
// other shape, and all of attention, is the AVX2 code. This file alone is
// compiled with the AVX-512 flags; attention.cc calls into it only after a
// runtime CPU check.
//
// Batches of a few rows up are compute-bound, and there one instruction per
// 16 weights instead of 8 pays: the 156M model's matrices on the 2-core VM
// took 0.64-0.73x AVX2's time at 4 and 16 rows, 0.47-0.75x at 64 (fp32,
// fp16, int8). One row is memory-bound, and level.
//
// The results are the AVX2 kernels' bit for bit, so a sequence's tokens do
// not depend on which of the two ISAs served it:
//  * packed rows: one 512-bit vector holds two weight rows' 8 columns (the
//    layout stores them side by side), against the activations' 8 columns
//    broadcast to both halves. Each half is the AVX2 accumulator of its row,
//    the same FMAs in the same order, reduced by the same horizontal sum.
//  * interleaved int8: 32 weights widened to int16 at once and dotted with
//    32 activations by one VNNI vpdpwssd (AVX2: two widens, two vpmaddwd and
//    two adds). Lane m and lane 8 + m hold the same block's pairs from
//    alternate 16-column steps; their exact int32 sum is AVX2's lane m.
// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings
// (their _mm512_undefined_* idiom, GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <cstdint>

#include "kernels/cpu/int8_layout.h"
#include "kernels/cpu/internal/int8_tile.h"
#include "kernels/cpu/internal/kernels.h"
#include "kernels/cpu/internal/simd_avx2.h"
#include "kernels/cpu/internal/storage.h"
#include "kernels/cpu/packed_layout.h"

namespace chunkattn::cpu::internal {
namespace {

// Two packed weight rows' 8 columns (16 stored values) as fp32.
__m512 Load16(const float* p, F32) { return _mm512_loadu_ps(p); }
__m512 Load16(const uint16_t* p, F16) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
__m512 Load16(const uint16_t* p, BF16) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// p[0..8) in both halves (AVX-512 F's 4 x 64-bit broadcast: the same bits
// as DQ's 8 x 32-bit one, which this file does not ask the CPU for).
__m512 Broadcast8(const float* p) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}

__m256 Low(__m512 v) { return _mm512_castps512_ps256(v); }
__m256 High(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// c(r0 .. r0+R, j0 .. j0+4) over packed rows (packed_layout.h): per 8
// columns the group's 32 stored values are rows 0|1 and rows 2|3.
template <class D, int R>
void PackedTile(const LinearArgs& a, int r0, int64_t j0) {
  const auto* p = static_cast<const typename D::T*>(a.w) + j0 * a.k;
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < a.k; i += kPackCols) {
    const __m512 w01 = Load16(p + i * kPackRows, D{});
    const __m512 w23 = Load16(p + i * kPackRows + 2 * kPackCols, D{});
    for (int r = 0; r < R; ++r) {
      const __m512 x = Broadcast8(a.a + (r0 + r) * a.a_stride + i);
      acc[r][0] = _mm512_fmadd_ps(x, w01, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, w23, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* c = a.c + (r0 + r) * a.c_stride + j0;
    c[0] = Avx2::HSum(Low(acc[r][0]));
    c[1] = Avx2::HSum(High(acc[r][0]));
    c[2] = Avx2::HSum(Low(acc[r][1]));
    c[3] = Avx2::HSum(High(acc[r][1]));
  }
}

// Rows in tiles of 8 (16 accumulators, 2 weight vectors and a broadcast of
// the 32 registers), each group of 4 weight rows converted once per tile.
template <class D>
void LinearPacked(const LinearArgs& a) {
  for (int64_t j = a.j0; j < a.j1; j += kPackRows) {
    int r = 0;
    for (; r + 8 <= a.rows; r += 8) PackedTile<D, 8>(a, r, j);
    if (r + 4 <= a.rows) PackedTile<D, 4>(a, r, j), r += 4;
    if (r + 2 <= a.rows) PackedTile<D, 2>(a, r, j), r += 2;
    if (r < a.rows) PackedTile<D, 1>(a, r, j);
  }
}

// AVX2's LinearTile16I (kernels_impl.h) with the 16-column steps taken two
// at a time; see the top of this file.
template <int R, int J>
void Int8Tile(const LinearArgs& a, int r0, int64_t j0) {
  const auto* w = static_cast<const int8_t*>(a.w);
  const int64_t ng = a.k / 32, spans = a.k / kInt8InterleavedSpan;
  __m256 acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t sp = 0; sp < spans; ++sp) {
    const int64_t c0 = sp * kInt8InterleavedSpan;
    const int8_t* row[J];
    Int8TileSpan<J>(w, a.scales, j0, sp, a.k, row);
    __m512i d[R][J];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) d[r][j] = _mm512_setzero_si512();
    for (int64_t v = 0; v < 8; ++v) {
      __m512i wv[J];
      for (int j = 0; j < J; ++j) {
        wv[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[j] + v * 32)));
      }
      for (int r = 0; r < R; ++r) {
        const __m512i x = _mm512_loadu_si512(a.aq + (r0 + r) * a.k + c0 + v * 32);
        for (int j = 0; j < J; ++j) d[r][j] = _mm512_dpwssd_epi32(d[r][j], wv[j], x);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 sa = _mm256_loadu_ps(a.aq_scales + (r0 + r) * ng + sp * 8);
      for (int j = 0; j < J; ++j) {
        const __m256 sw =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.scales + (j0 + j) * ng + sp * 8)));
        const __m256i sum = _mm256_add_epi32(_mm512_castsi512_si256(d[r][j]), _mm512_extracti64x4_epi64(d[r][j], 1));
        acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(sa, sw), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) a.c[(r0 + r) * a.c_stride + j0 + j] = Avx2::HSum(acc[r][j]);
}

// One row against 4 weight rows; more rows 4 at a time against 2 (8 int32
// sums, 8 accumulators, 2 widened weight vectors: 18 of 32 registers).
void LinearInt8Interleaved(const LinearArgs& a) {
  int64_t j = a.j0;
  if (a.rows == 1) {
    for (; j + 4 <= a.j1; j += 4) Int8Tile<1, 4>(a, 0, j);
  } else {
    for (; j + 2 <= a.j1; j += 2) {
      int r = 0;
      for (; r + 4 <= a.rows; r += 4) Int8Tile<4, 2>(a, r, j);
      for (; r + 2 <= a.rows; r += 2) Int8Tile<2, 2>(a, r, j);
      if (r < a.rows) Int8Tile<1, 2>(a, r, j);
    }
  }
  for (; j < a.j1; ++j) {
    for (int r = 0; r < a.rows; ++r) Int8Tile<1, 1>(a, r, j);
  }
}

// Packed rows from this many activation rows on. Under it the step streams
// its weights at memory speed either way, and the AVX2 tiles (4 FMA chains a
// row against these tiles' 2) measured level for 16-bit weights and 1.04-1.08x
// faster for fp32 (batches of 1 and 2, one and two threads; 3 rows: AVX-512
// 0.96x fp32, 0.71x fp16).
constexpr int kPackedMinRows = 3;

template <class D>
void Linear(const LinearArgs& a) {
  if (a.packed && a.rows >= kPackedMinRows) return LinearPacked<D>(a);
  static const auto avx2 = Avx2Kernels(D::kDType)->linear;
  avx2(a);
}

void LinearQ8(const LinearArgs& a) {
  if (a.aq != nullptr && a.interleaved) return LinearInt8Interleaved(a);
  static const auto avx2 = Avx2Kernels(DType::kFloat32)->linear_q8;
  avx2(a);
}

template <class D>
IsaKernels Table() {
  IsaKernels t = *Avx2Kernels(D::kDType);
  t.linear = &Linear<D>;
  t.linear_q8 = &LinearQ8;
  return t;
}

}  // namespace

CHUNKATTN_DEFINE_KERNEL_TABLES(Avx512Kernels, Table)

}  // namespace chunkattn::cpu::internal
