// fused_wgmma_rs2_kernel ("wgmma_rs"), M 65-128 on Hopper (sm_90a): wgmma with the weights as
// the A operand, decoded straight into registers, and x as B from shared memory
// (docs/kernels.md). The mma.sync kernels (gemm_nt_kernel.cuh) spend their time on matrix work
// at these M; wgmma has 2x the rate, and with A in registers the decode writes no shared
// memory.
// - One warpgroup takes a 64-channel slice (two repacked tiles), NWG of them a block, which
//   shares BNX tokens of x (the wgmma's N).
// - Lane (g, t) of a repacked tile holds channels 8 f + g at k 16 t .. 16 t + 15, and word s
//   of its 16 bytes is exactly the A fragment of k16 step s under the k order the decode
//   kernel uses (physical k = 16 t + 4 s + 2 u + h for logical k = 16 s + 8 u + 2 t + h). So a
//   thread decodes only its own lane: a shift, a lop3 and the exact (magic + c) - (magic + 1)
//   = c - 1 a register, with no correction term.
// - x is copied in that k order: a row's logical words 8 s + 4 u + t are its physical words
//   8 t + 2 s + u, a 4 x 8 transpose, done in registers (four 16-byte loads, four 16-byte
//   stores a row half) into the 128-byte swizzled K-major layout. Warpgroup kt % NWG moves
//   k tile kt, NWG steps ahead.
// - The raw weight pieces come by cp.async into an S-deep ring (each thread its own 16
//   bytes); A of step kt + 1 is decoded while wgmma(kt) runs.
// - Small grids split K (gridDim.z): each split stores its fp32 part in a workspace, and a
//   second kernel sums the parts in a fixed order (deterministic) and adds the bias.
// The body compiles only for sm_90a; sm90a_image_loaded() (route.cu) tells the host whether the
// loaded image has it.
#pragma once

#include "common/tu.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/async.cuh"
#include "common/launch.cuh"
#include "common/layout.cuh"
#include "common/wgmma.cuh"
#include "dtype.cuh"
#include "fused/launchers.h"

namespace ternary {
inline namespace TERNARY_TU {

template <typename T, int BNX, int NWG, int S>
__global__ void __launch_bounds__(128 * NWG)
fused_wgmma_rs2_kernel(const T* __restrict__ x, int64_t ldx, const uint4* __restrict__ w,
                       const float* __restrict__ scale, const T* __restrict__ bias,
                       T* __restrict__ y, float* __restrict__ ws, int m, int n, int kt_total,
                       int nt_count, bool per_tensor) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(NWG >= 2 && S >= NWG + 2 && S >= 5, "x tiles alternate over the warpgroups");
  constexpr int kT = 128 * NWG, kX = BNX * kTileK * 2, kNX = BNX / 64;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (sraw + 1023) & ~1023u;
  uint8_t* const sbase = smem_raw + (base - sraw);
  const uint32_t raw0 = base + S * kX, lo0 = wg_desc_lo(base);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * BNX;
  // split z of gridDim.z takes k tiles [kb, kb + kt_count)
  const int kb = (int)((int64_t)kt_total * blockIdx.z / gridDim.z);
  const int kt_count = (int)((int64_t)kt_total * (blockIdx.z + 1) / gridDim.z) - kb;
  const int tile = blockIdx.y * 2 * NWG + wg * 2 + (warp >> 1);
  const int flo = 2 * (warp & 1);
  const uint4* wt = w + ((int64_t)min(tile, nt_count - 1) * kt_total + kb) * 32 + lane;
  // x: thread (r, h) of a warpgroup moves the half h of row r: physical 16-byte pieces 2 t + h
  // (t = 0..3) hold logical word t of chunks 4 h .. 4 h + 3
  // (rows xr + 64 v for v < kNX)
  const int xr = (tid & 127) >> 1, xh = tid & 1;
  const uint4* xrow[kNX];
#pragma unroll
  for (int v = 0; v < kNX; ++v)
    xrow[v] = m0 + xr + 64 * v < m
                  ? reinterpret_cast<const uint4*>(x + (int64_t)(m0 + xr + 64 * v) * ldx + (int64_t)kb * kTileK) + xh
                  : nullptr;
  uint4 xq[kNX][4];
  auto xload = [&](int kt) {
#pragma unroll
    for (int v = 0; v < kNX; ++v)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        xq[v][i] = xrow[v] != nullptr && kt < kt_count ? __ldg(xrow[v] + kt * 8 + 2 * i) : make_uint4(0, 0, 0, 0);
  };
  auto xstore = [&](int kt) {
#pragma unroll
    for (int v = 0; v < kNX; ++v) {
      uint8_t* row = sbase + (kt % S) * kX + (xr + 64 * v) * 128;
      const uint32_t* q0 = reinterpret_cast<const uint32_t*>(&xq[v][0]);
      const uint32_t* q1 = reinterpret_cast<const uint32_t*>(&xq[v][1]);
      const uint32_t* q2 = reinterpret_cast<const uint32_t*>(&xq[v][2]);
      const uint32_t* q3 = reinterpret_cast<const uint32_t*>(&xq[v][3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = 4 * xh + j;
        *reinterpret_cast<uint4*>(row + ((c ^ (xr & 7)) << 4)) = make_uint4(q0[j], q1[j], q2[j], q3[j]);
      }
    }
  };
  auto rawload = [&](int kt) { raw_issue<S, kT>(raw0, tid, wt, kt, kt_count); };
  auto rawread = [&](int kt) { return raw_piece<S, kT>(sbase + S * kX, tid, kt, kt_count); };
  auto decode = [&](const uint4& q, uint32_t (&a)[4][4]) {
    const uint32_t word[4] = {q.x >> (4 * flo), q.y >> (4 * flo), q.z >> (4 * flo), q.w >> (4 * flo)};
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // f = flo + (i & 1), u = i >> 1: shift 2 (2 f + u)
        const int sh = 4 * (i & 1) + 2 * (i >> 1);
        a[s][i] = add_x2((T*)nullptr, lop3_and_or(word[s] >> sh, 0x00030003u, WgDec<T>::kMagic),
                         WgDec<T>::kSub);
      }
  };

  float d[BNX / 2];
#pragma unroll
  for (int i = 0; i < BNX / 2; ++i) d[i] = 0.f;
  uint32_t a[2][4][4];
  uint4 q[2];
  // prologue: raw tiles 0 .. S - 3 in flight; x tiles 0 .. NWG - 1 in shared memory (tile j by
  // warpgroup j), and each warpgroup's next tile (wg + NWG) in its registers
#pragma unroll
  for (int p = 0; p < S - 2; ++p) rawload(p);
  xload(wg);
  xstore(wg);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  xload(wg + NWG);
  cp_async_wait<S - 3>();
  decode(rawread(0), a[0]);
  cp_async_wait<S - 4>();
  q[1] = rawread(1);
  // Step kt: wgmma(kt) on x stage kt % S and A(kt); then A(kt + 1) is decoded from the raw
  // piece read last step, tile kt + 2's piece is read, and the warpgroup that owns tile
  // kt + NWG stores it (its registers) and loads tile kt + 2 NWG. The stage it overwrites
  // last held tile kt + NWG - S, read by a wgmma every warp waited for before this step's
  // barrier (S >= NWG + 2).
  auto step = [&](int kt, uint32_t (&acur)[4][4], uint32_t (&anext)[4][4], const uint4& qcur,
                  uint4& qnext) {
    __syncthreads();
    wg_mma_tile<T, BNX>(d, acur, lo0 + (kt % S) * (kX >> 4));
    wg_pin(anext);
    decode(qcur, anext);
    wg_pin(acur);
    wg_pin(d);
    cp_async_wait<S - 5>();  // raw tile kt + 2
    qnext = rawread(kt + 2);
    if (wg == (kt + NWG) % NWG && kt + NWG < kt_count) {
      xstore(kt + NWG);
      // before the next loads: the fence waits for this thread's loads in flight
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      xload(kt + 2 * NWG);
    }
    rawload(kt + S - 2);
  };
  for (int kt = 0; kt < kt_count; kt += 2) {
    step(kt, a[0], a[1], q[1], q[0]);
    if (kt + 1 < kt_count) step(kt + 1, a[1], a[0], q[0], q[1]);
  }
  pdl_trigger();  // the finish kernel of a split may start (it waits for this one)
  // wg_store_tile's 128 channels are the two warpgroups' 64
  static_assert(NWG == 2 && S * kX >= BNX * 256, "the output tile reuses the x ring");
  if (ws == nullptr)
    wg_store_tile<T, BNX>(d, a, wg, warp, lane, m0, blockIdx.y * 128, m, n, scale, per_tensor,
                          bias, base + wg * BNX * 128, sbase + wg * BNX * 128, y);
  else
    wg_finish<BNX>(d, a, blockIdx.y * 128 + wg * 64 + 16 * warp + g, m0, t, m, n, scale,
                   per_tensor, ws + (int64_t)blockIdx.z * m * n);
#endif
}

// y = the sum of the split-K parts (in split order) + bias
template <typename T>
__global__ void wgmma_rs_finish_kernel(const float* __restrict__ ws, const T* __restrict__ bias,
                                       T* __restrict__ y, int64_t m, int n, int splits) {
  pdl_wait();  // the split parts
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m * n) return;
  float acc = 0.f;
  for (int z = 0; z < splits; ++z) acc += ws[z * m * n + i];
  y[i] = from_float<T>(acc + (bias ? to_float(bias[i % n]) : 0.f));
}

}  // namespace TERNARY_TU

template <typename T, int BNX>
cudaError_t launch_wgmma_rs(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                            const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                            bool per_tensor, int splits, float* ws, cudaStream_t stream) {
  constexpr int kNWG = 2, kS = BNX == 64 ? 8 : 6;
  if (m > INT32_MAX - 512 || n > INT32_MAX - 512 || k > INT32_MAX - 64) return cudaErrorInvalidValue;
  if (k % kTileK || ldx % 8 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  if (splits < 1 || splits > 64 || (splits > 1 && ws == nullptr)) return cudaErrorInvalidValue;
  constexpr int kSmem = kS * (BNX * kTileK * 2 + 128 * kNWG * 16) + 1024;
  auto kernel = fused_wgmma_rs2_kernel<T, BNX, kNWG, kS>;
  const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return attr;
  const int kt_count = (int)(k / kTileK);
  const int64_t nt_count = (n + kTileN - 1) / kTileN;
  const int64_t mb = (m + BNX - 1) / BNX, nb = (n + 64 * kNWG - 1) / (64 * kNWG);
  if (nb > 65535 || mb > INT32_MAX / 2) return cudaErrorInvalidConfiguration;
  kernel<<<dim3((unsigned)mb, (unsigned)nb, (unsigned)splits), 128 * kNWG, kSmem, stream>>>(
      (const T*)x, ldx, reinterpret_cast<const uint4*>(repacked), scale, (const T*)bias, (T*)y,
      splits > 1 ? ws : nullptr, (int)m, (int)n, kt_count, (int)nt_count, per_tensor);
  if (splits > 1) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const int64_t total = m * n;
    return launch_k(wgmma_rs_finish_kernel<T>, dim3((unsigned)((total + 255) / 256)), dim3(256),
                    0, stream, true, ws, (const T*)bias, (T*)y, m, (int)n, splits);
  }
  return cudaGetLastError();
}

}  // namespace ternary
