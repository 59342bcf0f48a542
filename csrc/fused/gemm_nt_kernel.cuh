// fused_gemm_nt_kernel: the mma.sync kernel of M 17-128 (and of M > 128 where no wgmma
// route runs).
#pragma once

#include "common/tu.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/async.cuh"
#include "common/decode.cuh"
#include "common/launch.cuh"
#include "common/layout.cuh"
#include "common/epilogue.cuh"
#include "common/mma.cuh"
#include "dtype.cuh"
#include "fused/launchers.h"

namespace ternary {
inline namespace TERNARY_TU {

// Small batches (M 17-128, channel or tensor scale): fused_gemm_kernel's split of K over the
// warps of a block, but a warp step takes one k tile of NT neighbouring n tiles, so a warp
// loads and pre-scales its x fragments once for NT weight tiles, and the next step's x is in
// flight while this one decodes (PF). fused_gemm_kernel loads x for every n tile (at M = 64 on
// 4096 x 22016, 688 passes over x, 360 MB from L2 a call); halving that is worth 9 % there, as
// the mma.sync work is what bounds M >= 64 (docs/kernels.md). x is not staged once a block in
// shared memory with the warps split over N instead: that costs one barrier a k step and
// leaves too few warps to cover latency (2-6x slower).
template <typename T, int MT, int NT, int S, bool PF>
__global__ void __launch_bounds__(256, 1)
fused_gemm_nt_kernel(const T* __restrict__ x, int64_t ldx, const uint4* __restrict__ w,
                     const float* __restrict__ scale, const T* __restrict__ bias,
                     T* __restrict__ y, int m, int n, int kt_count, int nt_count,
                     bool per_tensor, const float* __restrict__ srow) {
  constexpr int kAcc = MT * NT * 16;  // a lane's accumulators
  // The weight rings [nwarps][S][NT][32 lanes] uint4; after the main loop the same memory
  // holds the tree sum's [nwarps / 2][kAcc][32 lanes] floats.
  extern __shared__ __align__(16) float red[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * 16 * MT, nt0 = blockIdx.y * NT;
  const uint4* xrow[MT][2];
  x_rows(xrow, x, ldx, m0, m, g);
  const uint4* wt[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j)  // a tile past N re-reads the last one; its outputs are dropped
    wt[j] = w + (int64_t)min(nt0 + j, nt_count - 1) * kt_count * 32 + lane;
  uint4* ring = reinterpret_cast<uint4*>(red) + warp * S * NT * 32 + lane;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) ring_issue(ring, s, wt, warp + s * nwarps, kt_count);

  float acc[MT][NT][4][4], corr[MT][4];
  zero(acc);
  zero(corr);
  uint32_t xa[MT][2][8];
  if (PF) {
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        load_x16(xa[a][h], warp < kt_count ? xrow[a][h] : nullptr, warp * kTileK + t * 16);
  }
  for (int i = 0, kt = warp; kt < kt_count; ++i, kt += nwarps) {
    ring_issue(ring, (i + S - 1) % S, wt, kt + (S - 1) * nwarps, kt_count);
    uint32_t xn[PF ? MT : 1][2][8];
    if (PF) {
      const int kx = kt + nwarps;
#pragma unroll
      for (int a = 0; a < (PF ? MT : 1); ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          load_x16(xn[a][h], kx < kt_count ? xrow[a][h] : nullptr, kx * kTileK + t * 16);
    } else {
#pragma unroll
      for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) load_x16(xa[a][h], xrow[a][h], kt * kTileK + t * 16);
    }
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h) prescale_x<T>(xa[a][h]);  // rows past M are zeros: stay so
    cp_async_wait<S - 1>();
    uint4 q[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) q[j] = ring[((i % S) * NT + j) * 32];
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
      for (int a = 0; a < MT; ++a)
        mma<T>(corr[a], xa[a][0][2 * wi], xa[a][1][2 * wi], xa[a][0][2 * wi + 1],
               xa[a][1][2 * wi + 1], Dec<T>::kOnes0, Dec<T>::kOnes1);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint32_t qw = wi == 0 ? q[j].x : wi == 1 ? q[j].y : wi == 2 ? q[j].z : q[j].w;
        uint32_t b[4][2];
        decode_word<T>(qw, b);
#pragma unroll
        for (int a = 0; a < MT; ++a)
#pragma unroll
          for (int f = 0; f < 4; ++f)
            mma<T>(acc[a][j][f], xa[a][0][2 * wi], xa[a][1][2 * wi], xa[a][0][2 * wi + 1],
                   xa[a][1][2 * wi + 1], b[f][0], b[f][1]);
      }
    }
    if (PF) {
#pragma unroll
      for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 8; ++e) xa[a][h][e] = xn[PF ? a : 0][h][e];
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int a = 0; a < MT; ++a)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int f = 0; f < 4; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[a][j][f][e] -= corr[a][e];
  __syncthreads();  // every warp is past its ring before the tree sum reuses the memory
  tree_sum(flat<kAcc>(acc), red, warp, nwarps, lane);
  if (warp != 0) return;
  // D fragment: acc[a][j][f][e] is row m0 + 16 a + g + 8 (e >> 1), column
  // 32 (nt0 + j) + 8 f + 2 t + (e & 1)
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = (nt0 + j) * kTileN + f * 8 + 2 * t + e;
        if (col >= n) continue;
        const float s = Dec<T>::kUnscale * (per_tensor ? scale[0] : scale[col]);
        const float b = bias ? to_float(bias[col]) : 0.f;
#pragma unroll
        for (int a = 0; a < MT; ++a) {
          const int row = m0 + a * 16 + g;
          if (row < m)
            y[(int64_t)row * n + col] =
                from_float<T>(epilogue(acc[a][j][f][e], s, b, bias, srow, row));
          if (row + 8 < m)
            y[(int64_t)(row + 8) * n + col] =
                from_float<T>(epilogue(acc[a][j][f][2 + e], s, b, bias, srow, row + 8));
        }
      }
}

}  // namespace TERNARY_TU

// Warps a block as launch_fused picks them (up to 8, while the grid has fewer than 16 an SM,
// every warp keeps at least S tiles and, for 8, the grid fits one wave); nwarps > 0 overrides
// it (bench/kernel_lab.cu sweeps it).
template <typename T, int MT, int NT, int S, bool PF>
cudaError_t launch_gemm_nt(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                           const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                           bool per_tensor, int num_sms, cudaStream_t stream, int nwarps,
                           const float* srow) {
  if (m > INT32_MAX - 64 || n > INT32_MAX - 64 || k > INT32_MAX - 64) return cudaErrorInvalidValue;
  if (k % kTileK || ldx % 8 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  const int kt_count = (int)(k / kTileK);
  const int64_t nt_count = (n + kTileN - 1) / kTileN;
  const int64_t mb = (m + 16 * MT - 1) / (16 * MT), nb = (nt_count + NT - 1) / NT;
  if (nb > 65535 || mb > INT32_MAX / 2) return cudaErrorInvalidConfiguration;
  constexpr int kAcc = MT * NT * 16;
  auto smem_for = [](int warps) {
    const size_t ring = (size_t)warps * S * NT * kTileBytes;
    const size_t tree = sizeof(float) * (warps / 2) * kAcc * 32;
    return ring > tree ? ring : tree;
  };
  auto kernel = fused_gemm_nt_kernel<T, MT, NT, S, PF>;
  if (nwarps == 0) {
    nwarps = 4;
    while (nwarps < 8 && mb * nb * nwarps < (int64_t)num_sms * 16 && kt_count >= nwarps * 2 * S)
      nwarps *= 2;
    // 8 warps only where the grid still fits one wave: past it, the second round of 8-warp
    // blocks costs more than the warps gain (4096 x 6144 at M = 33 / 64, 288 / 384 blocks at two
    // 8-warp blocks an SM, is about 15 % slower with 8; docs/kernels.md)
    static std::atomic<int> fit8[64];  // this instance's 8-warp blocks an SM, per device
    if (nwarps == 8 &&
        mb * nb > (int64_t)num_sms * occupancy_blocks(kernel, 256, smem_for(8), fit8))
      nwarps = 4;
  }
  if (nwarps < 1 || nwarps > 8 || (nwarps & (nwarps - 1))) return cudaErrorInvalidValue;
  const size_t smem = smem_for(nwarps);
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
  }
  kernel<<<dim3((unsigned)mb, (unsigned)nb), nwarps * 32, smem, stream>>>(
      (const T*)x, ldx, reinterpret_cast<const uint4*>(repacked), scale, (const T*)bias, (T*)y,
      (int)m, (int)n, kt_count, (int)nt_count, per_tensor, srow);
  return cudaGetLastError();
}

}  // namespace ternary
