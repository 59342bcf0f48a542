// fused_gemm_kernel: mma.sync with x as the A operand, one k tile of one n tile a warp step;
// the route's kernel for group scales.
#pragma once

#include "common/tu.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/async.cuh"
#include "common/decode.cuh"
#include "common/layout.cuh"
#include "common/mma.cuh"
#include "dtype.cuh"
#include "fused/launchers.h"

namespace ternary {
inline namespace TERNARY_TU {

// One block: 32 output channels x 16*MT rows of x. Its warps split the K tiles round-robin,
// each streaming them through a cp.async ring of S tiles (below), then sum
// their accumulators in a shared-memory tree (shared float atomics compile to CAS loops on
// sm_90, 2x slower end to end). Sizes fit in int (the launcher checks); offsets into
// x and the weight are 64-bit.
template <int MT> constexpr int max_warps() { return 8; }
// Registers decide residency: MT=1 is capped at 64 so that 8 blocks of 4 warps fit on an SM
// (the 4096 x 22016 grid of 688 blocks then runs in one wave instead of 1.3).
template <int MT, bool GROUP, bool HALF> constexpr int min_blocks() {
  return MT == 1 ? (HALF && !GROUP ? 4 : 2) : 1;
}

// HALF: M <= 8, so rows g+8 of the A fragments are known zeros (no loads, no registers).
template <typename T, int MT, bool GROUP, bool HALF>
__device__ __forceinline__ void fused_tile(const uint4& q, int kt, int nt, int t,
                                           const uint4* const (&xrow)[MT][2], bool hi_rows,
                                           int n, const float* __restrict__ scale,
                                           int group_size, int groups,
                                           float (&acc)[MT][4][4], float (&corr)[MT][4]) {
  const int kseg = kt * kTileK + t * 16;
  uint32_t xa[MT][2][8];
#pragma unroll
  for (int a = 0; a < MT; ++a) {
    load_x16(xa[a][0], xrow[a][0], kseg);
    prescale_x<T>(xa[a][0]);
    if (HALF) {
#pragma unroll
      for (int i = 0; i < 8; ++i) xa[a][1][i] = 0;
    } else {
      load_x16(xa[a][1], xrow[a][1], kseg);
      if (hi_rows) prescale_x<T>(xa[a][1]);  // else all zeros already
    }
  }
  float part[GROUP ? MT : 1][4][4];
  float cpart[GROUP ? MT : 1][4];
  if (GROUP) {
    zero(part);
    zero(cpart);
  }
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    uint32_t b[4][2];
    decode_word<T>(qw[wi], b);
#pragma unroll
    for (int a = 0; a < MT; ++a) {
      const uint32_t a0 = xa[a][0][2 * wi], a1 = xa[a][1][2 * wi];
      const uint32_t a2 = xa[a][0][2 * wi + 1], a3 = xa[a][1][2 * wi + 1];
#pragma unroll
      for (int f = 0; f < 4; ++f)
        mma<T>(GROUP ? part[GROUP ? a : 0][f] : acc[a][f], a0, a1, a2, a3, b[f][0], b[f][1]);
      mma<T>(GROUP ? cpart[GROUP ? a : 0] : corr[a], a0, a1, a2, a3, Dec<T>::kOnes0,
             Dec<T>::kOnes1);
    }
  }
  if (GROUP) {
    // group_size is a multiple of 64, so a tile lies in one group.
    const int gi = kt * kTileK / group_size;
#pragma unroll
    for (int f = 0; f < 4; ++f) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = nt * kTileN + f * 8 + 2 * t + e;
        const float s = col < n ? __ldg(scale + (int64_t)col * groups + gi) : 0.f;
#pragma unroll
        for (int a = 0; a < MT; ++a) {
          acc[a][f][e] += (part[GROUP ? a : 0][f][e] - cpart[GROUP ? a : 0][e]) * s;
          acc[a][f][2 + e] += (part[GROUP ? a : 0][f][2 + e] - cpart[GROUP ? a : 0][2 + e]) * s;
        }
      }
    }
  }
}

template <typename T, int MT, int S, bool GROUP, bool HALF>
__global__ void __launch_bounds__(max_warps<MT>() * 32, min_blocks<MT, GROUP, HALF>())
fused_gemm_kernel(const T* __restrict__ x, int64_t ldx, const uint4* __restrict__ w,
                  const float* __restrict__ scale, const T* __restrict__ bias,
                  T* __restrict__ y, int m, int n, int kt_count, int group_size, int groups,
                  bool per_tensor) {
  // [nwarps / 2][16 * MT][32 lanes] floats for the final tree sum, then the weight rings
  // [nwarps][S][32 lanes] uint4.
  extern __shared__ __align__(16) float red[];
  const int red_floats = (blockDim.x >> 6) * 16 * MT * 32;
  constexpr int kAcc = MT * 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * 16 * MT;
  const int nt = blockIdx.y;
  const uint4* xrow[MT][2];
  x_rows(xrow, x, ldx, m0, m, g);
  const bool hi_rows = m0 + 8 < m;  // (used for MT == 1 only; larger MT prescale every row)

  float acc[MT][4][4], corr[MT][4];
  zero(acc);
  zero(corr);

  // Each warp streams its tiles through a private ring of S 512-byte slots in shared memory,
  // S-1 tiles in flight while one is decoded (two tiles in registers leave the kernel
  // latency-bound, with DRAM 16 % busy).
  const uint4* const wt[1] = {w + (int64_t)nt * kt_count * 32 + lane};
  uint4* ring = reinterpret_cast<uint4*>(red + red_floats) + warp * S * 32 + lane;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) ring_issue(ring, s, wt, warp + s * nwarps, kt_count);
  for (int i = 0, kt = warp; kt < kt_count; ++i, kt += nwarps) {
    ring_issue(ring, (i + S - 1) % S, wt, kt + (S - 1) * nwarps, kt_count);
    cp_async_wait<S - 1>();
    const uint4 q = ring[(i % S) * 32];
    fused_tile<T, MT, GROUP, HALF>(q, kt, nt, t, xrow, MT == 1 ? hi_rows : true, n, scale,
                                   group_size, groups, acc, corr);
  }
  cp_async_wait<0>();
  if (!GROUP) {
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
      for (int f = 0; f < 4; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[a][f][e] -= corr[a][e];
  }
  tree_sum(flat<kAcc>(acc), red, warp, nwarps, lane);
  if (warp != 0) return;
#pragma unroll
  for (int f = 0; f < 4; ++f) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = nt * kTileN + f * 8 + 2 * t + e;
      if (col >= n) continue;
      float s = Dec<T>::kUnscale;
      if (!GROUP) s *= per_tensor ? scale[0] : scale[col];
      const float b = bias ? to_float(bias[col]) : 0.f;
#pragma unroll
      for (int a = 0; a < MT; ++a) {
        const int row = m0 + a * 16 + g;
        if (row < m) y[(int64_t)row * n + col] = from_float<T>(acc[a][f][e] * s + b);
        if (row + 8 < m) y[(int64_t)(row + 8) * n + col] = from_float<T>(acc[a][f][2 + e] * s + b);
      }
    }
  }
}

}  // namespace TERNARY_TU

template <typename T, int MT, int S, bool GROUP, bool HALF>
cudaError_t launch_fused(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                         const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                         int64_t group_size, bool per_tensor, int num_sms, cudaStream_t stream) {
  // int arithmetic inside the kernel: every index below 2^31 (row * ldx is 64-bit there).
  if (m > INT32_MAX - 64 || n > INT32_MAX - 64 || k > INT32_MAX - 64 ||
      (int64_t)m * n > INT64_MAX / 2)
    return cudaErrorInvalidValue;
  const int kt_count = (int)((k + kTileK - 1) / kTileK);
  const int64_t nt_count = (n + kTileN - 1) / kTileN;
  const int64_t mb = (m + 16 * MT - 1) / (16 * MT);
  if (nt_count > 65535 || mb > INT32_MAX / 2) return cudaErrorInvalidConfiguration;
  // About 16 warps per SM, each with S-1 tiles in flight, while every warp keeps at least
  // S tiles so its ring fills.
  int nwarps = 4;
  while (nwarps < max_warps<MT>() && mb * nt_count * nwarps < (int64_t)num_sms * 16 &&
         kt_count >= nwarps * 2 * S)
    nwarps *= 2;
  if (k % kTileK || ldx % 8 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  const int64_t groups = group_size ? (k + group_size - 1) / group_size : 1;
  const size_t smem = sizeof(float) * (nwarps / 2) * 16 * MT * 32 + (size_t)nwarps * S * kTileBytes;
  const dim3 grid((unsigned)mb, (unsigned)nt_count);
  fused_gemm_kernel<T, MT, S, GROUP, HALF><<<grid, nwarps * 32, smem, stream>>>(
      (const T*)x, ldx, reinterpret_cast<const uint4*>(repacked), scale, (const T*)bias, (T*)y,
      (int)m, (int)n, kt_count, (int)group_size, (int)groups, per_tensor);
  return cudaGetLastError();
}

}  // namespace ternary
