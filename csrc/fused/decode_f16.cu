#define TERNARY_TU decode_f16_cu  // this file's namespace (common/tu.cuh)
// The decode kernel's instances that launch_fused_typed (route.cu) takes, float16
// (TERNARY_INST_DECODE_ROUTE, decode_kernel.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fused/decode_kernel.cuh"

namespace ternary {

TERNARY_INST_DECODE_ROUTE(__half)

}  // namespace ternary
