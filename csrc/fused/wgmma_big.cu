#define TERNARY_TU wgmma_big_cu  // this file's namespace (common/tu.cuh)
// wgmma_big's instances that launch_fused_typed (route.cu) takes: 64 and 128 tokens a tile
// with 8 stages, kBigRows with kBigStages.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fused/wgmma_big_kernel.cuh"

namespace ternary {

#define TERNARY_INST_WGMMA_BIG(T, BNX, S)                                                     \
  template cudaError_t launch_wgmma_big<T, BNX, S, 0>(                                        \
      const void*, int64_t, const uint8_t*, const float*, const void*, void*, int64_t, int64_t, \
      int64_t, bool, int, int64_t, float*, int, cudaStream_t, const float*);
TERNARY_INST_WGMMA_BIG(__half, 64, 8)
TERNARY_INST_WGMMA_BIG(__half, 128, 8)
TERNARY_INST_WGMMA_BIG(__half, kBigRows, kBigStages)
TERNARY_INST_WGMMA_BIG(__nv_bfloat16, 64, 8)
TERNARY_INST_WGMMA_BIG(__nv_bfloat16, 128, 8)
TERNARY_INST_WGMMA_BIG(__nv_bfloat16, kBigRows, kBigStages)
#undef TERNARY_INST_WGMMA_BIG

}  // namespace ternary
