// Tags for the KV storage type, so one kernel template serves fp32, fp16 and
// bf16 pools and the dtype becomes a template argument at one dispatch point.
// I8 is weight-only int8 (Linear weights, never KV): each value needs its
// block's scale, so only the Linear kernels take it. kDType names a float
// tag's dtype (the table functions map back from DType to it).
#ifndef CHUNKATTN_KERNELS_CPU_INTERNAL_STORAGE_H_
#define CHUNKATTN_KERNELS_CPU_INTERNAL_STORAGE_H_

#include <cstdint>

#include "kernels/api/dtype.h"

namespace chunkattn::cpu::internal {

struct F32 { using T = float; static constexpr DType kDType = DType::kFloat32; };
struct F16 { using T = uint16_t; static constexpr DType kDType = DType::kFloat16; };
struct BF16 { using T = uint16_t; static constexpr DType kDType = DType::kBFloat16; };
struct I8 { using T = int8_t; };

}  // namespace chunkattn::cpu::internal

#endif  // CHUNKATTN_KERNELS_CPU_INTERNAL_STORAGE_H_
