#define TERNARY_TU gemm_cu  // this file's namespace (common/tu.cuh)
// The mma.sync kernels' instances that launch_fused_typed (route.cu) takes: fused_gemm
// (group scales) and fused_gemm_nt.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fused/gemm_kernel.cuh"
#include "fused/gemm_nt_kernel.cuh"

namespace ternary {

#define TERNARY_INST_GEMM(T)                                                                  \
  template cudaError_t launch_fused<T, 1, 8, true, true>(                                     \
      const void*, int64_t, const uint8_t*, const float*, const void*, void*, int64_t, int64_t, \
      int64_t, int64_t, bool, int, cudaStream_t);                                             \
  template cudaError_t launch_fused<T, 1, 8, true, false>(                                    \
      const void*, int64_t, const uint8_t*, const float*, const void*, void*, int64_t, int64_t, \
      int64_t, int64_t, bool, int, cudaStream_t);                                             \
  template cudaError_t launch_gemm_nt<T, 1, 2, 4, true>(                                      \
      const void*, int64_t, const uint8_t*, const float*, const void*, void*, int64_t, int64_t, \
      int64_t, bool, int, cudaStream_t, int, const float*);
TERNARY_INST_GEMM(__half)
TERNARY_INST_GEMM(__nv_bfloat16)
#undef TERNARY_INST_GEMM

}  // namespace ternary
