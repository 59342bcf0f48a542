// The 2-bit code -> bf16/fp16 decode of the mma.sync kernels (the layout: common/layout.cuh).
// Decoding is LUT-free and has no arithmetic: `word & 0x00030003` read as a packed
// bfloat162/half2 is a pair of subnormals c * 2^-133 (bf16) or c * 2^-24 (fp16), where
// c = w + 1 in {0, 1, 2}: the value is linear in the bits while the exponent field is 0.
// So the mma sums x * c (scaled), and one more mma per k16 step against a constant
// fragment of ones sums x; y = (sum x*c - sum x) * 2^133 or 2^24 (folded into the scale).
// For bf16 the products x * c * 2^-133 would be fp32 subnormals, so x is pre-scaled by
// 2^100 (exact: a power of two). Pair r=1 of fragment f then sits at bits 4f+2, read as 4c
// without a shift; its x is pre-scaled by 2^98 instead. Per 32-bit word: 3 shifts and
// 8 ANDs for 16 weights.
#pragma once

#include "common/tu.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ternary {
inline namespace TERNARY_TU {

template <typename T> struct Dec;
template <> struct Dec<__nv_bfloat16> {
  static constexpr bool kSlotR1 = true;           // r=1 read at bits 2-3 as 4c, no shift
  static constexpr uint32_t kXr0 = 0x71807180u;   // 2^100 in both halves
  static constexpr uint32_t kXr1 = 0x70807080u;   // 2^98
  static constexpr uint32_t kOnes0 = 0x00010001u; // 1 * 2^-133 (the correction fragment)
  static constexpr uint32_t kOnes1 = 0x00040004u; // 4 * 2^-133, matches the 2^98 of r=1
  static constexpr float kUnscale = 8589934592.f; // 2^33 = 2^133 / 2^100
};
template <> struct Dec<__half> {
  // fp16 products x * c * 2^-24 are normal floats: x stays as it is, r=1 takes a shift.
  static constexpr bool kSlotR1 = false;
  static constexpr uint32_t kOnes0 = 0x00010001u, kOnes1 = 0x00010001u;
  static constexpr float kUnscale = 16777216.f;   // 2^24
};

template <typename T>
__device__ __forceinline__ void decode_word(uint32_t q, uint32_t (&b)[4][2]) {
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    const uint32_t v = q >> (4 * f);
    b[f][0] = v & 0x00030003u;
    b[f][1] = Dec<T>::kSlotR1 ? (v & 0x000C000Cu) : ((v >> 2) & 0x00030003u);
  }
}

// decode_word for the weights as the A operand (the decode kernel): f odd are the mma's rows
// g + 8, and those read bits 4-7 of each byte in place, 16x the value, so a word takes one
// shift (bf16) instead of three. The kernel's correction uses 16x ones on those rows and
// its epilogue takes the 16 back out (exact: a power of two on every term of the sum).
template <typename T>
__device__ __forceinline__ void decode_word_a(uint32_t q, uint32_t (&b)[4][2]) {
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    const uint32_t v = f < 2 ? q : q >> 8;
    const uint32_t mk = (f & 1) ? 0x00300030u : 0x00030003u;
    b[f][0] = v & mk;
    b[f][1] = Dec<T>::kSlotR1 ? (v & (mk << 2)) : ((v >> 2) & mk);
  }
}
constexpr float kRowHiUnscale = 0.0625f;  // rows g + 8 under decode_word_a

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
#if __CUDA_ARCH__ >= 900
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#else
  // mul.bf16x2 is sm_90+; an fma with a -0.0 addend rounds the same product once and keeps
  // the sign of zero (the current target also builds for sm_80 and sm_89).
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#endif
  return d;
}

// Pre-scales one row's 16 x values for the bf16 subnormal decode (identity for fp16).
template <typename T> __device__ __forceinline__ void prescale_x(uint32_t (&xr)[8]) {
  if constexpr (Dec<T>::kSlotR1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) xr[i] = mul_bf16x2(xr[i], (i & 1) ? Dec<T>::kXr1 : Dec<T>::kXr0);
  }
}

}  // namespace TERNARY_TU
}  // namespace ternary
