// Storage types of the KV pool. Arithmetic is always fp32; the dtype only
// says how K and V are stored (fp32 on CPU; fp16/bf16 as the GPU stores them,
// so the CPU oracle can check the GPU on identical bits).
#ifndef CHUNKATTN_KERNELS_API_DTYPE_H_
#define CHUNKATTN_KERNELS_API_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "base/host_device.h"

namespace chunkattn {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16 };

CHUNKATTN_HOST_DEVICE constexpr int DTypeBytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }

constexpr const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
  }
  return "?";
}

// "fp32" | "fp16" | "bf16" (also "float32", "float16", "bfloat16").
inline std::optional<DType> ParseDType(std::string_view s) {
  if (s == "fp32" || s == "float32") return DType::kFloat32;
  if (s == "fp16" || s == "float16") return DType::kFloat16;
  if (s == "bf16" || s == "bfloat16") return DType::kBFloat16;
  return std::nullopt;
}

// Scalar conversions, bit-exact with the hardware ones (round to nearest
// even, NaN kept NaN, overflow to infinity). Used to write the pool and by the
// portable kernels; the SIMD paths use F16C / shifts with identical results.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0);  // inf/NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: overflow
  if (abs < 0x38800000u) {                       // below the smallest normal half
    if (abs < 0x33000000u) return sign;          // rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// Stores `f` as dtype `t` at element `i` of `base`.
inline void StoreAs(DType t, void* base, int64_t i, float f) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = f; return;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = FloatToHalf(f); return;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = FloatToBFloat16(f); return;
  }
}

// Reads element `i` of `base` stored as dtype `t`.
inline float LoadAs(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(base)[i]);
  }
  return 0;
}

}  // namespace chunkattn

#endif  // CHUNKATTN_KERNELS_API_DTYPE_H_
