// Non-x86 hosts: no AVX2 tables.
#include "kernels/cpu/internal/kernels.h"

namespace chunkattn::cpu::internal {
const IsaKernels* Avx2Kernels(DType) { return nullptr; }
}  // namespace chunkattn::cpu::internal
