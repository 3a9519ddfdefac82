// Non-x86 hosts: no AVX2 or AVX-512 tables.
#include "kernels/cpu/internal/kernels.h"

namespace chunkattn::cpu::internal {
const IsaKernels* Avx2Kernels(DType) { return nullptr; }
const IsaKernels* Avx512Kernels(DType) { return nullptr; }
}  // namespace chunkattn::cpu::internal
