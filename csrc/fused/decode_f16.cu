#define TERNARY_TU decode_f16_cu  // this file's namespace (common/tu.cuh)
// The decode kernel's instances that launch_fused_typed (route.cu) takes, float16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fused/decode_kernel.cuh"

namespace ternary {

#define TERNARY_INST_DECODE(S, NB, NT, XS)                                                    \
  template cudaError_t launch_decode<__half, S, NB, NT, 0, XS, true>(                         \
      const void*, int64_t, const uint8_t*, const float*, const void*, void*, int64_t, int64_t, \
      int64_t, bool, int, cudaStream_t, int);
TERNARY_INST_DECODE(4, 1, 1, 1)  // kDecode
TERNARY_INST_DECODE(4, 1, 2, 1)  // kDecodePair
TERNARY_INST_DECODE(2, 1, 1, 0)  // kDecodeShallow
TERNARY_INST_DECODE(4, 2, 2, 0)  // kDecodeWide
TERNARY_INST_DECODE(4, 2, 1, 0)  // kDecodeNt2, kDecodeNt2W4
#undef TERNARY_INST_DECODE

}  // namespace ternary
