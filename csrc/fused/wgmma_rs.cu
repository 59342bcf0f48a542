#define TERNARY_TU wgmma_rs_cu  // this file's namespace (common/tu.cuh)
// wgmma_rs's instances that launch_fused_typed (route.cu) takes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fused/wgmma_rs_kernel.cuh"

namespace ternary {

#define TERNARY_INST_WGMMA_RS(T)                                                              \
  template cudaError_t launch_wgmma_rs<T, 128>(                                               \
      const void*, int64_t, const uint8_t*, const float*, const void*, void*, int64_t, int64_t, \
      int64_t, bool, int, float*, cudaStream_t);
TERNARY_INST_WGMMA_RS(__half)
TERNARY_INST_WGMMA_RS(__nv_bfloat16)
#undef TERNARY_INST_WGMMA_RS

}  // namespace ternary
