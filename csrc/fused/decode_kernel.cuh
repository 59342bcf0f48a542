// fused_decode_kernel: M <= 16, the weights as the mma.sync A operand and x as B.
#pragma once

#include "common/tu.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/async.cuh"
#include "common/decode.cuh"
#include "common/layout.cuh"
#include "common/epilogue.cuh"
#include "common/launch.cuh"
#include "common/mma.cuh"
#include "dtype.cuh"
#include "fused/launchers.h"
#include "kernels.h"

namespace ternary {
inline namespace TERNARY_TU {

// Decode batches (M <= 8 NB, channel or tensor scale): the weights are the mma's A operand
// and x its B operand, the reverse of fused_gemm_kernel. An m16n8k16 then covers 16 output
// channels x 16 k for 8 batch columns: per tile 8 NB mma instead of 20 (fused_gemm_kernel
// spends the 16 A rows on at most 16 rows of x, half of them empty at M <= 8, plus 4 mma for
// the correction). No relayout: lane (g, t) of a tile already holds rows f = 0..3
// (n = 8 f + g) at the 16 k of its segment, and for k16 step wi the pairs (f, r) are exactly
// the A fragment's registers {row g, row g + 8} x {k 2t.., k 2t+8..} of m16 block f / 2; the
// B fragment of batch block nb is the x pairs fused_gemm_kernel loaded as A (x row
// 8 nb + g, elements 4 wi + 2 r + h of the segment).
// A warp step takes one k tile of NT neighbouring n tiles (x is read and pre-scaled once for
// NT weight tiles), and the next step's x loads are in flight while this one decodes. The sum
// of x that removes the code offset (y = sum c x - sum x) comes from one more mma per k16
// step with A = the constant fragment of ones, shared by the NT tiles (summing x in a
// prologue, row after row, would serialize the block behind it).
// The time is the warps' serial instruction chains (the stage ablations below show it), so
// the k loop is kept short: unrolled over the ring slots, pointers stepped rather than
// recomputed, x rows past M never rewritten, and rows g + 8 decoded in place (decode_word_a):
// 85 SASS instructions a k tile on sm_90a with one m block (docs/kernels.md).
// ABL is for bench/kernel_lab.cu only, which times what each stage costs by leaving it out
// (wrong results): 1 the correction mma, 2 the decode (raw words go to the mma), 4 the
// weight mma (decoded words are folded into one output), 8 the x loads, 16 all but the
// launch, the tree sum and the stores.
// MINB 2 keeps the kernel to 64 registers, so that two 16-warp blocks share an SM
// (launch_decode says where).
// SR: srow is read (ternary::linear_a8). A compile-time flag, so that activation none's
// instances carry no per-row pointer: as a runtime pointer it cost them spill traffic
// (244 B of spill loads on sm_90a, 788 B on sm_80, against 140 and 420 without it).
template <typename T, int S, int NB, int NT, int ABL = 0, bool XS = false, bool SE = false,
          int MINB = 1, bool SR = false>
__global__ void __launch_bounds__(512, MINB)
fused_decode_kernel(const T* __restrict__ x, int64_t ldx, const uint4* __restrict__ w,
                    const float* __restrict__ scale, const T* __restrict__ bias,
                    T* __restrict__ y, int m, int n, int kt_count, int nt_count,
                    bool per_tensor, const float* __restrict__ srow, bool early) {
  constexpr int kAcc = NT * 2 * NB * 4;  // a lane's accumulators (the tree sum's floats)
  if (ABL & 16) kt_count = 0;
  // [nwarps / 2][kAcc][32 lanes] floats for the tree sum, then the weight rings
  // [nwarps][S][NT][32 lanes] uint4.
  extern __shared__ __align__(16) float red[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nt0 = blockIdx.x * NT;

  const uint4* wt[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j)  // a tile past N re-reads the last one; its outputs are dropped
    wt[j] = w + (int64_t)min(nt0 + j, nt_count - 1) * kt_count * 32 + lane;
  uint4* ring = reinterpret_cast<uint4*>(red + (nwarps >> 1) * kAcc * 32) + warp * S * NT * 32 +
                lane;
  const uint4* xrow[NB];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
    xrow[nb] = 8 * nb + g < m && !(ABL & 8)
                   ? reinterpret_cast<const uint4*>(x + (int64_t)(8 * nb + g) * ldx)
                   : nullptr;
  // XS: the block's x rows, all of K, are copied to shared memory ahead of the weight stream.
  // Loaded a step or two ahead from global instead, x waits behind the weight tiles in the
  // SM's load queue (at M = 1, 22 % of the warp samples, whether one or two steps ahead;
  // docs/kernels.md). A lane copies, and later reads, its
  // own 32 bytes of each of its warp's steps: rows 8 nb + g, k 16 t .. 16 t + 15.
  const int spw = (kt_count + nwarps - 1) / nwarps;
  uint4* const xs = ring - lane + (nwarps - warp) * S * NT * 32 + warp * spw * m * 8 + 2 * t;
  auto stage_x = [&] {
    for (int i = 0, kt = warp; kt < kt_count; ++i, kt += nwarps)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
        if (xrow[nb]) {
          uint4* d = xs + (i * m + 8 * nb + g) * 8;
          const uint4* src = xrow[nb] + kt * (kTileK / 8) + 2 * t;
          cp_async16(d, src);
          cp_async16(d + 1, src + 1);
        }
  };
  // early (a programmatic launch behind linear_a8's quantize, which triggers at its start):
  // the ring's first tiles are issued while the quantize runs, and x (with s, and every
  // write of y) waits for it in pdl_wait; x then follows tiles already in flight, in a cp.async
  // group of its own that is waited for at once (the first step's wait counts on x riding in
  // the ring's first group, as it does when x goes first). Launched plainly, x goes first and
  // pdl_wait returns at once. SR instances read x from global and s with coherent loads,
  // which stay below the wait (common/launch.cuh, ld_coherent).
  if (XS && !early) stage_x();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) ring_issue(ring, s, wt, warp + s * nwarps, kt_count);
  // SE: warp 0's store loop reads a scale a channel; loaded only there, each is a DRAM round
  // trip at the end of the block (8-15 % of the warp samples at M = 1 and 16)
  float se[NT][2][2];
  if (SE && warp == 0) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int hb = 0; hb < 2; ++hb)
#pragma unroll
        for (int eh = 0; eh < 2; ++eh) {
          const int col = (nt0 + j) * kTileN + 16 * hb + g + 8 * eh;
          se[j][hb][eh] = col < n ? __ldg(per_tensor ? scale : scale + col) : 0.f;
        }
  }
  pdl_wait();
  if (XS && early) {
    stage_x();
    cp_async_commit();
    cp_async_wait<0>();  // (a lane reads back only the x it copied)
  }
  uint32_t sink = 0;
  float acc[NT][2][NB][4], corr[NB][4];
  zero(acc);
  zero(corr);
  // x of this step and of the next (x from global). The k loop is unrolled over the S ring
  // slots, so slot indices and the x buffer are fixed at compile time: no per-step index
  // math and no register copies of the next step's x. Rows past M stay the zeros set here
  // (prescale keeps them), so no step writes them; a load past this warp's last step is
  // skipped and leaves stale values that no step reads.
  static_assert(S % 2 == 0, "fused_decode_kernel: the unrolled k loop alternates two x buffers");
  uint32_t xv[2][NB][8];
  zero(xv);
  const uint4* xp[NB];  // this lane's x at the next step to load (x from global)
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    xp[nb] = xrow[nb] + warp * (kTileK / 8) + 2 * t;  // (unused where xrow is null)
    if (!XS) load_x16p<!SR>(xv[0][nb], xp[nb], xrow[nb] && warp < kt_count);
  }
  const int xstep = nwarps * (kTileK / 8);
  const uint4* wn[NT];  // the next k tile to issue into the ring, S - 1 steps ahead
#pragma unroll
  for (int j = 0; j < NT; ++j) wn[j] = wt[j] + (int64_t)(warp + (S - 1) * nwarps) * 32;
  const int64_t wstep = (int64_t)nwarps * 32;

  // this warp's k tiles: warp, warp + nwarps, ... (the loop counts steps, not k tiles)
  const int steps = warp < kt_count ? (kt_count - warp + nwarps - 1) / nwarps : 0;
  for (int i0 = 0; i0 < steps; i0 += S) {
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int i = i0 + u;
      if (i >= steps) break;
      uint32_t(&xb)[NB][8] = xv[XS ? 0 : u & 1];
      if (i + S - 1 < steps) {
#pragma unroll
        for (int j = 0; j < NT; ++j) cp_async16(ring + (((u + S - 1) % S) * NT + j) * 32, wn[j]);
      }
      cp_async_commit();  // (empty past the end: the waits count one group a step)
#pragma unroll
      for (int j = 0; j < NT; ++j) wn[j] += wstep;
      if (XS) {
        cp_async_wait<S - 1>();  // the first step's group holds all of this lane's x
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          if (xrow[nb]) {
            const uint4* sx = xs + (i * m + 8 * nb + g) * 8;
            const uint4 v0 = sx[0], v1 = sx[1];
            xb[nb][0] = v0.x; xb[nb][1] = v0.y; xb[nb][2] = v0.z; xb[nb][3] = v0.w;
            xb[nb][4] = v1.x; xb[nb][5] = v1.y; xb[nb][6] = v1.z; xb[nb][7] = v1.w;
          }
        }
      } else {
        // the next step's x, in flight while this one decodes
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          xp[nb] += xstep;
          load_x16p<!SR>(xv[(u + 1) & 1][nb], xp[nb], xrow[nb] && i + 1 < steps);
        }
      }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) prescale_x<T>(xb[nb]);
      if (!XS) cp_async_wait<S - 1>();
      uint4 q[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) q[j] = ring[(u * NT + j) * 32];
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
          if (!(ABL & 1))
            mma<T>(corr[nb], Dec<T>::kOnes0, Dec<T>::kOnes0 << 4, Dec<T>::kOnes1,
                   Dec<T>::kOnes1 << 4, xb[nb][2 * wi], xb[nb][2 * wi + 1]);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint32_t qw = wi == 0 ? q[j].x : wi == 1 ? q[j].y : wi == 2 ? q[j].z : q[j].w;
          uint32_t b[4][2];
          if (ABL & 2) {
#pragma unroll
            for (int f = 0; f < 4; ++f) b[f][0] = b[f][1] = qw + f;
          } else {
            decode_word_a<T>(qw, b);
          }
          if (ABL & 4) {
#pragma unroll
            for (int f = 0; f < 4; ++f) sink ^= b[f][0] + b[f][1] + xb[0][2 * wi];
          } else {
#pragma unroll
            for (int hb = 0; hb < 2; ++hb)
#pragma unroll
              for (int nb = 0; nb < NB; ++nb)
                mma<T>(acc[j][hb][nb], b[2 * hb][0], b[2 * hb + 1][0], b[2 * hb][1],
                       b[2 * hb + 1][1], xb[nb][2 * wi], xb[nb][2 * wi + 1]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  if (ABL & 4) acc[0][0][0][0] += (float)(sink & 1);
  // acc[j][hb][nb][e] and corr[nb][e] are the same batch row (below): subtract before the
  // tree sum, which is linear, so it carries one array
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int hb = 0; hb < 2; ++hb)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][hb][nb][e] -= corr[nb][e];
  tree_sum(flat<kAcc>(acc), red, warp, nwarps, lane);
  if (warp != 0) return;
  // D fragment: acc[j][hb][nb][e] is output channel 32 (nt0 + j) + 16 hb + g + 8 (e >> 1),
  // batch row 8 nb + 2 t + (e & 1), less that row's sum of x (corr: every A row is ones).
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 8 * nb + 2 * t + (e & 1);
      if (row >= m) continue;
      const float sr = SR ? ld_coherent(srow + row) : 1.f;  // (once a row, not a channel)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int hb = 0; hb < 2; ++hb) {
          const int col = (nt0 + j) * kTileN + 16 * hb + g + 8 * (e >> 1);
          if (col >= n) continue;
          const float s = Dec<T>::kUnscale * ((e >> 1) ? kRowHiUnscale : 1.f) *
                          (SE ? se[j][hb][e >> 1] : per_tensor ? scale[0] : scale[col]);
          const float b = bias ? to_float(bias[col]) : 0.f;
          y[(int64_t)row * n + col] =
              from_float<T>(SR ? epilogue_a8(acc[j][hb][nb][e], s, b, bias, sr)
                               : epilogue(acc[j][hb][nb][e], s, b, bias, nullptr, row));
        }
    }
}

}  // namespace TERNARY_TU

// Warps a block: the launcher adds warps (up to 16) while the grid has fewer than 12 an SM and
// every warp keeps S tiles to stream; nwarps > 0 overrides it (bench/kernel_lab.cu sweeps it).
// At M = 1 with S = 4 that is the fastest of 4, 8 and 16 warps, or within 0.4 us of it, on
// every shape in docs/kernels.md.
// XS: 0 x from global, 2 x staged in shared memory (fused_decode_kernel), 1 staged where the
// block's x is at most 32 KB and the grid at most two blocks an SM: staging pays while an SM
// holds one or two blocks, and costs time from three blocks an SM or past 32 KB of x.
template <typename T, int S, int NB, int NT, int ABL, int XS, bool SE>
cudaError_t launch_decode(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                          const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                          bool per_tensor, int num_sms, cudaStream_t stream, int nwarps,
                          const float* srow) {
  if (m > 8 * NB || n > INT32_MAX - 64 || k > INT32_MAX - 64) return cudaErrorInvalidValue;
  if (k % kTileK || ldx % 8 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  const int kt_count = (int)(k / kTileK);
  const int64_t nt_count = (n + kTileN - 1) / kTileN;
  const int64_t blocks = (nt_count + NT - 1) / NT;
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
  if (nwarps == 0) {
    nwarps = 4;
    while (nwarps < 16 && blocks * nwarps < (int64_t)num_sms * 12 && kt_count >= nwarps * 2 * S)
      nwarps *= 2;
  }
  if (nwarps < 1 || nwarps > 16 || (nwarps & (nwarps - 1))) return cudaErrorInvalidValue;
  constexpr int kAcc = NT * 2 * NB * 4;
  const size_t smem = sizeof(float) * (nwarps / 2) * kAcc * 32 +
                      (size_t)nwarps * S * NT * kTileBytes;
  const int64_t spw = (kt_count + nwarps - 1) / nwarps;
  const size_t xs_bytes = (size_t)nwarps * spw * m * 128;
  const int64_t per_sm = (blocks + num_sms - 1) / num_sms;
  const bool xs = XS == 2 || (XS == 1 && xs_bytes <= 32 * 1024 && per_sm <= 2);
  // Grids of 1-2 blocks an SM take 16 warps (above), and two such blocks fit an SM only at 64
  // registers or fewer: with the early scales (SE) the one-m-block kernel uses 66, so unbounded
  // they run in two rounds. The bound costs every other instance about 1 %, so only these
  // grids take it (bounded, the two-m-block kernels spill).
  const bool two = NB == 1 && nwarps == 16 && blocks > num_sms;
  auto pick = [&](auto sr) {
    constexpr bool SR = decltype(sr)::value;
    return xs    ? fused_decode_kernel<T, S, NB, NT, ABL, XS != 0, SE, 1, SR>
           : two ? fused_decode_kernel<T, S, NB, NT, ABL, false, SE, NB == 1 ? 2 : 1, SR>
                 : fused_decode_kernel<T, S, NB, NT, ABL, false, SE, 1, SR>;
  };
  auto kernel = srow ? pick(std::true_type{}) : pick(std::false_type{});
  const size_t bytes = smem + (xs ? xs_bytes : 0);
  if (bytes > 227 * 1024) return cudaErrorInvalidValue;  // (XS = 2: bench/kernel_lab.cu only)
  if (bytes > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return e;
  }
  // With srow the kernel before is linear_a8's quantize, which triggers (act_quant.cu). Only
  // where the sm_90a image runs: a kernel body built for an older arch (PTX JIT-compiled on
  // Hopper) has no pdl_wait, and launched early would read x before the quantize wrote it.
  const bool early = srow != nullptr && pdl_allowed() && sm90a_image_loaded();
  return launch_k(kernel, dim3((unsigned)blocks), dim3(nwarps * 32), bytes, stream, early,
                  (const T*)x, ldx, reinterpret_cast<const uint4*>(repacked), scale,
                  (const T*)bias, (T*)y, (int)m, (int)n, kt_count, (int)nt_count, per_tensor,
                  srow, early);
}

// The instances launch_fused_typed (route.cu) takes, for activations T: decode_bf16.cu and
// decode_f16.cu compile one T each (in parallel), both from this one list.
#define TERNARY_INST_DECODE(T, S, NB, NT, XS)                                                   \
  template cudaError_t launch_decode<T, S, NB, NT, 0, XS, true>(                                \
      const void*, int64_t, const uint8_t*, const float*, const void*, void*, int64_t, int64_t, \
      int64_t, bool, int, cudaStream_t, int, const float*);
#define TERNARY_INST_DECODE_ROUTE(T)                                                            \
  TERNARY_INST_DECODE(T, 4, 1, 1, 1) /* kDecode */                                              \
  TERNARY_INST_DECODE(T, 4, 1, 2, 1) /* kDecodePair */                                          \
  TERNARY_INST_DECODE(T, 2, 1, 1, 0) /* kDecodeShallow */                                       \
  TERNARY_INST_DECODE(T, 4, 2, 2, 0) /* kDecodeWide */                                          \
  TERNARY_INST_DECODE(T, 4, 2, 1, 0) /* kDecodeNt2, kDecodeNt2W4 */

}  // namespace ternary
