// The same 8-lane interface as simd_avx2.h in plain C++: the fallback on hosts
// without AVX2 (and on non-x86 hosts), and a second, simpler implementation
// the tests hold the AVX2 path against.
#ifndef CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_PORTABLE_H_
#define CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_PORTABLE_H_

#include <cmath>
#include <cstdint>

#include "kernels/api/dtype.h"
#include "kernels/cpu/internal/storage.h"

namespace chunkattn::cpu::internal {

struct Portable {
  struct V {
    float x[8];
  };
  static constexpr int kLanes = 8;

  static V Zero() { return Set1(0.0f); }
  static V Set1(float a) {
    V r;
    for (float& e : r.x) e = a;
    return r;
  }
  static V Load(const float* p) {
    V r;
    for (int i = 0; i < 8; ++i) r.x[i] = p[i];
    return r;
  }
  static void Store(float* p, V v) {
    for (int i = 0; i < 8; ++i) p[i] = v.x[i];
  }
  static V Fma(V a, V b, V c) {
    for (int i = 0; i < 8; ++i) c.x[i] = std::fma(a.x[i], b.x[i], c.x[i]);
    return c;
  }
  static V Mul(V a, V b) {
    for (int i = 0; i < 8; ++i) a.x[i] *= b.x[i];
    return a;
  }
  static V Add(V a, V b) {
    for (int i = 0; i < 8; ++i) a.x[i] += b.x[i];
    return a;
  }
  static V Sub(V a, V b) {
    for (int i = 0; i < 8; ++i) a.x[i] -= b.x[i];
    return a;
  }
  static V Max(V a, V b) {
    for (int i = 0; i < 8; ++i) a.x[i] = a.x[i] > b.x[i] ? a.x[i] : b.x[i];
    return a;
  }
  static V LoadKv(const float* p, F32) { return Load(p); }
  static V LoadKv(const uint16_t* p, F16) {
    V r;
    for (int i = 0; i < 8; ++i) r.x[i] = HalfToFloat(p[i]);
    return r;
  }
  static V LoadKv(const uint16_t* p, BF16) {
    V r;
    for (int i = 0; i < 8; ++i) r.x[i] = BFloat16ToFloat(p[i]);
    return r;
  }
  static V LoadI8(const int8_t* p) {
    V r;
    for (int i = 0; i < 8; ++i) r.x[i] = static_cast<float>(p[i]);
    return r;
  }
  // See Avx2::W16: the same lanes, so both give the same sums.
  struct W16 {
    int16_t w[32];
  };
  static W16 LoadW16(const int8_t* p) {
    W16 r;
    for (int i = 0; i < 32; ++i) r.w[i] = p[i];
    return r;
  }
  static V Dot16(const W16& w, const int16_t* x) {
    V r;
    for (int m = 0; m < 8; ++m) {
      int32_t s = 0;
      for (int c : {2 * m, 2 * m + 1, 16 + 2 * m, 17 + 2 * m}) s += int32_t{w.w[c]} * x[c];
      r.x[m] = static_cast<float>(s);
    }
    return r;
  }
  // See Avx2::I32: the same lanes, exact integers, so both give the same sums.
  struct I32 {
    int32_t x[8];
  };
  struct W8 {
    int16_t w[16];
  };
  static I32 ZeroI() { return I32{}; }
  static W8 LoadW8(const int8_t* p) {
    W8 r;
    for (int i = 0; i < 16; ++i) r.w[i] = p[i];
    return r;
  }
  static I32 MaddAcc(I32 acc, const W8& w, const int16_t* x) {
    for (int m = 0; m < 8; ++m) acc.x[m] += int32_t{w.w[2 * m]} * x[2 * m] + int32_t{w.w[2 * m + 1]} * x[2 * m + 1];
    return acc;
  }
  static V ToFloat(const I32& v) {
    V r;
    for (int m = 0; m < 8; ++m) r.x[m] = static_cast<float>(v.x[m]);
    return r;
  }
  static float Quantize16(const float* x, int16_t* q) {
    float m = 0;
    for (int i = 0; i < 32; ++i) {
      if (!std::isfinite(x[i])) {
        for (int j = 0; j < 32; ++j) q[j] = 0;
        return NAN;
      }
      m = std::fabs(x[i]) > m ? std::fabs(x[i]) : m;
    }
    const float inv = m > 0 ? 32767.0f / m : 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float r = std::nearbyint(x[i] * inv);
      q[i] = static_cast<int16_t>(r > 32767.0f ? 32767.0f : (r < -32768.0f ? -32768.0f : r));
    }
    return m / 32767.0f;
  }
  static float HSum(V v) {
    float s = 0;
    for (float e : v.x) s += e;
    return s;
  }
  static float HMax(V v) {
    float m = v.x[0];
    for (float e : v.x) m = e > m ? e : m;
    return m;
  }
  static void HSum4(V a, V b, V c, V d, float* out) {
    out[0] = HSum(a);
    out[1] = HSum(b);
    out[2] = HSum(c);
    out[3] = HSum(d);
  }
  static V Exp(V v) {
    for (float& e : v.x) e = std::exp(e);
    return v;
  }
};

}  // namespace chunkattn::cpu::internal

#endif  // CHUNKATTN_KERNELS_CPU_INTERNAL_SIMD_PORTABLE_H_
