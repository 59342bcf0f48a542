// mma.sync m16n8k16 and the register-fragment helpers of the mma.sync kernels: x fragment
// loads, the block's tree sum of the accumulators, and register-array utilities.
#pragma once

#include "common/tu.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ternary {
inline namespace TERNARY_TU {

template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], uint32_t a0, uint32_t a1,
                                                   uint32_t a2, uint32_t a3, uint32_t b0,
                                                   uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 consecutive elements of one x row (two 16-byte loads), or zeros for a row past M
// (row == nullptr). The host pads x to whole 64-wide tiles and 16-byte aligned rows, so no
// K bound is checked here.
__device__ __forceinline__ void load_x16(uint32_t (&out)[8], const uint4* row, int k0) {
  if (row == nullptr) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = 0;
    return;
  }
  const uint4 v0 = __ldg(row + k0 / 8), v1 = __ldg(row + k0 / 8 + 1);
  out[0] = v0.x; out[1] = v0.y; out[2] = v0.z; out[3] = v0.w;
  out[4] = v1.x; out[5] = v1.y; out[6] = v1.z; out[7] = v1.w;
}

// The x rows of a lane's A fragments for MT m16 tiles from row m0: xrow[a][h] is row
// m0 + 16 a + 8 h + g (g = lane / 4), null past M (load_x16 then gives zeros).
template <int MT, typename T>
__device__ __forceinline__ void x_rows(const uint4* (&xrow)[MT][2], const T* x, int64_t ldx,
                                       int m0, int m, int g) {
#pragma unroll
  for (int a = 0; a < MT; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + a * 16 + h * 8 + g;
      xrow[a][h] = row < m ? reinterpret_cast<const uint4*>(x + (int64_t)row * ldx) : nullptr;
    }
}

// load_x16 at a lane's own pointer (row and k already applied), only where `pred`; else `out`
// keeps what it held. (As a C++ branch, the compiler wraps it in divergent-branch bookkeeping
// each step.) NC: through the non-coherent path, for x no kernel writes while this one runs;
// false for a kernel that may run ahead of x's writer (common/launch.cuh, ld_coherent).
// (the one asm, at either load: string literals concatenate, a runtime choice cannot)
#define LOAD_X16P_ASM(LD)                                                              \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %8, 0;\n"                               \
               " @p " LD ".v4.u32 {%0, %1, %2, %3}, [%9];\n"                                \
               " @p " LD ".v4.u32 {%4, %5, %6, %7}, [%9 + 16];\n}"                          \
               : "+r"(out[0]), "+r"(out[1]), "+r"(out[2]), "+r"(out[3]), "+r"(out[4]),     \
                 "+r"(out[5]), "+r"(out[6]), "+r"(out[7])                                   \
               : "r"((int)pred), "l"(p))
template <bool NC = true>
__device__ __forceinline__ void load_x16p(uint32_t (&out)[8], const uint4* p, bool pred) {
  if constexpr (NC) {
    LOAD_X16P_ASM("ld.global.nc");
  } else {
    LOAD_X16P_ASM("ld.global");
  }
}
#undef LOAD_X16P_ASM

// Sums N floats a lane over the block's warps (nwarps a power of two) through a shared-memory
// tree of (nwarps / 2) x N x 32 floats at red; warp 0 ends with the total. Each kernel passes
// its accumulator array flat (acc[MT][4][4] and the like are contiguous).
template <int N>
__device__ __forceinline__ void tree_sum(float (&acc)[N], float* red, int warp, int nwarps,
                                         int lane) {
  for (int half = nwarps >> 1; half >= 1; half >>= 1) {
    if (warp >= half && warp < 2 * half) {
      float* dst = red + (warp - half) * N * 32 + lane;
#pragma unroll
      for (int i = 0; i < N; ++i) dst[i * 32] = acc[i];
    }
    __syncthreads();
    if (warp < half) {
      const float* src = red + warp * N * 32 + lane;
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] += src[i * 32];
    }
    __syncthreads();
  }
}
template <int N, typename A> __device__ __forceinline__ float (&flat(A& a))[N] {
  static_assert(sizeof(A) == N * sizeof(float), "flat: size mismatch");
  return reinterpret_cast<float(&)[N]>(a);
}

// zeroes every float of a register array of any shape
template <typename A> __device__ __forceinline__ void zero(A& a) {
  constexpr int kN = sizeof(A) / sizeof(float);
  float(&f)[kN] = flat<kN>(a);
#pragma unroll
  for (int i = 0; i < kN; ++i) f[i] = 0.f;
}

}  // namespace TERNARY_TU
}  // namespace ternary
