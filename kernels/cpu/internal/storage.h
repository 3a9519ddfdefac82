// Tags for the KV storage type, so one kernel template serves fp32, fp16 and
// bf16 pools and the dtype becomes a template argument at one dispatch point.
// I8 is weight-only int8 (Linear weights, never KV): each value needs its
// block's scale, so only the Linear kernels take it.
#ifndef CHUNKATTN_KERNELS_CPU_INTERNAL_STORAGE_H_
#define CHUNKATTN_KERNELS_CPU_INTERNAL_STORAGE_H_

#include <cstdint>

namespace chunkattn::cpu::internal {

struct F32 { using T = float; };
struct F16 { using T = uint16_t; };
struct BF16 { using T = uint16_t; };
struct I8 { using T = int8_t; };

}  // namespace chunkattn::cpu::internal

#endif  // CHUNKATTN_KERNELS_CPU_INTERNAL_STORAGE_H_
