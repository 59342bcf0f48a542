// The output epilogue the float kernels share, for activation none and int8_per_token.
#pragma once

#include "common/launch.cuh"
#include "common/tu.cuh"

namespace ternary {
inline namespace TERNARY_TU {

// acc: the kernel's float32 sum of x * w for one output; s: what turns it into x . w * scale
// (the code's power-of-two unscale times the channel scale); b: the bias as float.
// srow null (activation none): acc * s + b, as the kernels always computed it.
// srow set (int8_per_token, x the integer-valued x_q): acc * s is the exact integer sum times
// scale rounded once (acc is that integer times a power of two, exact in float32 while
// K * 256 < 2^24), then / s[row] and + b (none without a bias: -0.0 stays -0.0), each
// rounded once: gemm_a8's epilogue (csrc/gemm_a8.cu) bit for bit, so every route of
// ternary::linear_a8 gives the same bits.
// sr: the row's s, read with ld_coherent (a programmatic launch reads it after pdl_wait).
__device__ __forceinline__ float epilogue_a8(float acc, float s, float b, bool has_bias,
                                             float sr) {
  const float v = __fdiv_rn(__fmul_rn(acc, s), sr);
  return has_bias ? __fadd_rn(v, b) : v;
}
__device__ __forceinline__ float epilogue(float acc, float s, float b, bool has_bias,
                                          const float* srow, int row) {
  if (srow) return epilogue_a8(acc, s, b, has_bias, ld_coherent(srow + row));
  return acc * s + b;
}

}  // namespace TERNARY_TU
}  // namespace ternary
