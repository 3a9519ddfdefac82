// The AVX2 + FMA + F16C instantiation of the CPU kernels. This file alone is
// compiled with -mavx2 -mfma -mf16c; attention.cc calls into it only after a
// runtime CPU check.
#include "kernels/cpu/internal/kernels_impl.h"
#include "kernels/cpu/internal/simd_avx2.h"

namespace chunkattn::cpu::internal {
CHUNKATTN_DEFINE_KERNEL_TABLES(Avx2Kernels, Impl<Avx2>::Table)
}  // namespace chunkattn::cpu::internal
