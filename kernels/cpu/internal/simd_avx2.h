// 8-lane fp32 vector operations on AVX2 + FMA + F16C. Included only by the
// ISA-specific translation units (kernels_avx2.cc, and kernels_avx512.cc for
// the helpers its wider kernels share bit for bit), each compiled with its
// own flags. The struct lives in an anonymous namespace, so each of those
// files has a private copy: the linker can never hand the AVX2 path a helper
// that was compiled for AVX-512 (or the portable path one for AVX2).
#ifndef CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_
#define CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/internal/storage.h"

namespace chunkattn::cpu::internal {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int kLanes = 8;

  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }

  // Eight stored K/V elements as fp32.
  static V LoadKv(const float* p, F32) { return _mm256_loadu_ps(p); }
  static V LoadKv(const uint16_t* p, F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V LoadKv(const uint16_t* p, BF16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }

  // Eight int8 weights as fp32 (exact).
  static V LoadI8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }

  // int8 weights against int16 activations (LinearArgs::aq): 32 weights
  // widened to int16 once, then dotted with any row's 32 activations. Lane m
  // of Dot16 is the int32 sum of columns 2m, 2m+1, 16+2m and 17+2m: exact,
  // and exact as fp32 too (|sum| <= 4 * 127 * 32767 < 2^24).
  struct W16 {
    __m256i lo, hi;
  };
  static W16 LoadW16(const int8_t* p) {
    return {_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  static V Dot16(const W16& w, const int16_t* x) {
    const __m256i lo = _mm256_madd_epi16(w.lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    const __m256i hi = _mm256_madd_epi16(w.hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16)));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
  }
  // Interleaved int8 rows (int8_layout.h): 16 weights widened to int16, and
  // their dot with 16 int16 activations added to 8 int32 lanes, lane m taking
  // columns 2m and 2m + 1 (so block m of the interleaved span). Exact while a
  // lane sums at most 2^31 / (127 * 32768) = 516 products.
  using I32 = __m256i;
  using W8 = __m256i;
  static I32 ZeroI() { return _mm256_setzero_si256(); }
  static W8 LoadW8(const int8_t* p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I32 MaddAcc(I32 acc, W8 w, const int16_t* x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))));
  }
  static V ToFloat(I32 v) { return _mm256_cvtepi32_ps(v); }

  // q[0..32) = round(x / scale) with scale = max |x| / 32767, returned (0 for
  // a zero group; NaN, q all 0, when x holds a NaN or an infinity, so the
  // row's outputs are NaN). Rounds to nearest even, as Portable's nearbyint.
  static float Quantize16(const float* x, int16_t* q) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    V v[4];
    V amax = _mm256_setzero_ps();
    __m256 nan = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], abs_mask));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    }
    const float m = HMax(amax);
    if (_mm256_movemask_ps(nan) != 0 || !(m <= std::numeric_limits<float>::max())) {
      std::memset(q, 0, 32 * sizeof(int16_t));
      return std::numeric_limits<float>::quiet_NaN();
    }
    const float scale = m / 32767.0f;
    const V inv = _mm256_set1_ps(m > 0 ? 32767.0f / m : 0.0f);
    __m256i w[4];
    for (int i = 0; i < 4; ++i) w[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    // packs works within 128-bit halves: restore column order.
    const __m256i a = _mm256_permute4x64_epi64(_mm256_packs_epi32(w[0], w[1]), 0xD8);
    const __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi32(w[2], w[3]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), b);
    return scale;
  }

  static float HSum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float HMax(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[0..4) = horizontal sums of a, b, c, d.
  static void HSum4(V a, V b, V c, V d, float* out) {
    const __m256 ab = _mm256_hadd_ps(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
    const __m256 cd = _mm256_hadd_ps(c, d);
    const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 ...
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
    _mm_storeu_ps(out, s);
  }

  // exp(x) to about 2 ulp for x in [-87.3, 88.7]; 0 below (so exp(-inf) = 0,
  // which masked scores rely on), +inf above. Cody-Waite reduction
  // x = n ln2 + r with |r| <= ln2/2, then a degree-6 Taylor polynomial.
  static V Exp(V x) {
    const V underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const V n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    V p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }
};

}  // namespace
}  // namespace chunkattn::cpu::internal

#endif  // CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_
