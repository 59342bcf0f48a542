#define TERNARY_TU gemm_a8_cu  // this file's namespace (common/tu.cuh)
// W1.58A8 on int8 tensor cores: y[m, n] = (sum_k xq[m, k] * w[n, k]) * w_scale / s[m] + bias,
// xq int8 (ternary::quantize_act_int8's output), w the ternary codes of the canonical packed
// layout decoded to int8, mma.sync m16n8k32 s8 with int32 accumulation (exact: |sum| <=
// 128 * K), one float32 epilogue. Every arch from sm_80 on (mma.sync s8 is sm_80+).
//
// A block takes 64 tokens x 64 channels and walks K in tiles of 64: the x tile and the decoded
// weight tile go to shared memory, then each of the 4 warps (2 x 2) multiplies a 32 x 32
// quarter, 2 x 4 m16n8 tiles, two k32 steps a tile. Rows are 80 bytes apart in shared memory
// so the fragment loads (8 rows x 4 words a warp) hit 32 distinct banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/tu.cuh"
#include "dtype.cuh"
#include "kernels.h"

namespace ternary {
inline namespace TERNARY_TU {

constexpr int kBM = 64, kBN = 64, kBK = 64;  // tokens, channels, k (int8) a block tile
constexpr int kLd = kBK + 16;                // shared row stride in bytes (bank spread)
constexpr int kThreads = 128;

__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One packed byte (4 codes c = w + 1 at bits 2j, k = 4b + j) -> 4 int8 w in k order.
__device__ __forceinline__ uint32_t decode_byte(uint32_t p) {
  const uint32_t c = (p & 3u) | ((p >> 2) & 3u) << 8 | ((p >> 4) & 3u) << 16 | ((p >> 6) & 3u) << 24;
  return __vsub4(c, 0x01010101u);  // per byte, no borrow between them
}

// OutT int32_t: the raw sums (the exactness check); otherwise the float32 epilogue.
template <typename OutT>
__global__ void __launch_bounds__(kThreads)
gemm_a8_kernel(const int8_t* __restrict__ xq, const float* __restrict__ s,
               const uint8_t* __restrict__ packed, const float* __restrict__ scale,
               const OutT* __restrict__ bias, OutT* __restrict__ y, int m, int n, int k,
               bool per_tensor) {
  __shared__ __align__(16) int8_t xs[kBM * kLd];
  __shared__ __align__(16) int8_t ws[kBN * kLd];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const int kb = k / 4;  // packed bytes a weight row (k is a multiple of 4)
  // loader roles: a row of the tile and which 32 bytes of it (of x) / 8 packed bytes (of w)
  const int lrow = tid >> 1, lhalf = tid & 1;

  int acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0;

  for (int k0 = 0; k0 < k; k0 += kBK) {
    {  // x: 8 words of row m0 + lrow, bytes k0 + 32 * lhalf ..; zeros past m and k
      const int row = m0 + lrow;
      uint32_t v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int col = k0 + lhalf * 32 + i * 4;
        v[i] = row < m && col < k ? *reinterpret_cast<const uint32_t*>(xq + (int64_t)row * k + col)
                                  : 0u;
      }
      uint4* dst = reinterpret_cast<uint4*>(xs + lrow * kLd + lhalf * 32);
      dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
      dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
    }
    {  // w: 8 packed bytes of channel n0 + lrow -> 32 int8; code 1 (w = 0) past n and k
      const int row = n0 + lrow;
      uint32_t v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int b = k0 / 4 + lhalf * 8 + i;
        const uint32_t p = row < n && b < kb ? packed[(int64_t)row * kb + b] : 0x55u;
        v[i] = decode_byte(p);
      }
      uint4* dst = reinterpret_cast<uint4*>(ws + lrow * kLd + lhalf * 32);
      dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
      dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 32) {
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int8_t* base = xs + (wm + i * 16 + g) * kLd + kk + t4 * 4;
        a[i][0] = *reinterpret_cast<const uint32_t*>(base);
        a[i][1] = *reinterpret_cast<const uint32_t*>(base + 8 * kLd);
        a[i][2] = *reinterpret_cast<const uint32_t*>(base + 16);
        a[i][3] = *reinterpret_cast<const uint32_t*>(base + 8 * kLd + 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int8_t* base = ws + (wn + j * 8 + g) * kLd + kk + t4 * 4;
        b[j][0] = *reinterpret_cast<const uint32_t*>(base);
        b[j][1] = *reinterpret_cast<const uint32_t*>(base + 16);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_s8(acc[i][j], a[i], b[j]);
    }
    __syncthreads();
  }

  // c0, c1: row g, columns 2 * t4 + (0, 1); c2, c3: row g + 8
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + wm + i * 16 + g + h * 8;
      if (row >= m) continue;
      const float s_row = s[row];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n0 + wn + j * 8 + t4 * 2 + e;
          if (col >= n) continue;
          const int v = acc[i][j][h * 2 + e];
          OutT* out = y + (int64_t)row * n + col;
          if constexpr (std::is_same_v<OutT, int32_t>) {
            *out = v;
          } else {
            // (the order of ternary.ops._gemm_a8_ref: sum x scale, then / s, then + bias)
            float f = (float)v * (per_tensor ? scale[0] : scale[col]) / s_row;
            if (bias) f += to_float(bias[col]);
            *out = from_float<OutT>(f);
          }
        }
    }
}

template <typename OutT>
cudaError_t launch_typed(const int8_t* xq, const float* s, const uint8_t* packed,
                         const float* scale, const void* bias, void* y, int64_t m, int64_t n,
                         int64_t k, bool per_tensor, cudaStream_t stream) {
  const dim3 grid((unsigned)((n + kBN - 1) / kBN), (unsigned)((m + kBM - 1) / kBM));
  gemm_a8_kernel<OutT><<<grid, kThreads, 0, stream>>>(
      xq, s, packed, scale, (const OutT*)bias, (OutT*)y, (int)m, (int)n, (int)k, per_tensor);
  return cudaGetLastError();
}

}  // namespace TERNARY_TU

cudaError_t launch_gemm_a8(const int8_t* xq, const float* s, const uint8_t* packed,
                           const float* scale, const void* bias, void* y, A8Out out, int64_t m,
                           int64_t n, int64_t k, bool per_tensor, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  // m, n, k as int inside the kernel (offsets are int64); the grid's y dimension holds at
  // most 65535 token tiles; 4-byte loads of x rows need k % 4 == 0
  if (k % 4 || k >= (int64_t)1 << 31 || n >= (int64_t)1 << 31 || m > (int64_t)65535 * kBM)
    return cudaErrorInvalidValue;
  switch (out) {
    case A8Out::kHalf:
      return launch_typed<__half>(xq, s, packed, scale, bias, y, m, n, k, per_tensor, stream);
    case A8Out::kBFloat16:
      return launch_typed<__nv_bfloat16>(xq, s, packed, scale, bias, y, m, n, k, per_tensor,
                                         stream);
    case A8Out::kFloat:
      return launch_typed<float>(xq, s, packed, scale, bias, y, m, n, k, per_tensor, stream);
    case A8Out::kInt32:
      return launch_typed<int32_t>(xq, s, packed, scale, bias, y, m, n, k, per_tensor, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ternary
