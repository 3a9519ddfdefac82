// The portable instantiation of the CPU kernels (no ISA flags).
#include "kernels/cpu/internal/kernels_impl.h"
#include "kernels/cpu/internal/simd_portable.h"

namespace chunkattn::cpu::internal {
CHUNKATTN_DEFINE_KERNEL_TABLES(PortableKernels, Impl<Portable>::Table)
}  // namespace chunkattn::cpu::internal
