// 8-lane fp32 vector operations on AVX2 + FMA + F16C. Included only by
// kernels_avx2.cc, which is the one translation unit compiled with those
// flags; everything here is static members so no symbol is shared with the
// portable build of the same templates.
#ifndef CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_
#define CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/internal/storage.h"

namespace chunkattn::cpu::internal {

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

}  // namespace chunkattn::cpu::internal

#endif  // CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_AVX2_H_
