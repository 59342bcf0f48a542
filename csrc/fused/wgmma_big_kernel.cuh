// fused_wgmma_big_kernel: M > 32 on Hopper, warp-specialized, x by TMA, persistent past a
// wave; and wgmma_big_finish_kernel, the sum of its split-K parts.
#pragma once

#include "common/tu.cuh"
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/async.cuh"
#include "common/launch.cuh"
#include "common/layout.cuh"
#include "common/mma.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dtype.cuh"
#include "fused/launchers.h"

namespace ternary {
inline namespace TERNARY_TU {

// M > 128 on Hopper (sm_90a), where the grid has at least half a wave of blocks: the decode and
// wgmma of fused_wgmma_rs2_kernel (weights as A from registers, x as B from shared memory)
// with 256 tokens a block, so one decoded A fragment feeds m64n256k16, 4x the tensor work of
// the M <= 128 kernel's m64n64 (docs/kernels.md). Warp-specialized, no block
// barrier in the loop:
// - warpgroup 2, one thread: moves each 64-wide k tile of x by TMA into an S-stage ring (the
//   copy engine writes the 128-byte swizzle wgmma reads); the "full" mbarrier counts bytes,
//   rows past m arrive as zeros.
// - warpgroups 0 and 1, 64 channels each: wait for a stage, issue the wgmma, release the
//   stage they finished with ("empty", after wgmma(kt - 1) retired), decode the next A.
// x arrives in its own k order here, so the A fragment must too: lane (g, t) needs, for k16
// step s, words t / 2 and 2 + t / 2 of lane (g, s)'s 16 bytes (the tile layout,
// common/layout.cuh, holds physical k = 16 t + 4 s' + 2 u' + h in word s' of lane t). Each
// lane cp.asyncs its own 16 bytes (8-deep ring), packs the bytes of this warp's channels into
// two words (one prmt each), and a k16 step takes its word by one indexed shuffle within the
// quad (5 a k tile; decode).
// setmaxnreg gives the consumers 232 registers (128 fp32 accumulators, two k tiles of A).
// Block b of a launch takes tile tile0 + b (row block t % row_blocks, channel block
// t / row_blocks). With ws, K is split gridDim.z ways: the fp32 parts go to ws, a 256 x 128
// tile each ([z][b]), and wgmma_big_finish_kernel sums them in split order. Grids under half
// a wave split every tile; grids of a wave or more split only the tiles of the last, partial
// wave, in a second launch (launch_wgmma_big).
// P (persistent; launch_wgmma_big takes it for 256-token tiles past a wave, unsplit, with at
// least 2 k tiles): one block an SM takes tiles tile0 + b,
// b + gridDim.x, ... of `tiles`, and the x ring and its phases run on from tile to tile, so
// the producer loads the next tile's first stages while the consumers finish this one. Each
// tile's k steps are rounded up to whole rounds of S (the producer completes the pad stages'
// "full" phase without a load, the consumers wait for it and release them unread), which
// keeps every stage index and descriptor a compile-time constant in the unrolled loop. The
// consumers keep the last two stages of a tile, write the output tile into them (a
// warpgroup's half a stage), and release them after the stores; the next tile's first weight
// pieces are fetched before the epilogue. ABL (kernel_lab's timing-only ablations, wrong
// results): 1 no decode (A kept from the tile's first k tile), 2 no weight loads and no
// decode, 3 no wgmma (the fence, commit and wait kept).
template <typename T, int BNX, int S, bool P, int ABL = 0>
__global__ void __launch_bounds__(384, 1)
fused_wgmma_big_kernel(const uint4* __restrict__ w, const float* __restrict__ scale,
                       const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ ws,
                       int m, int n, int kt_total, int nt_count, bool per_tensor, int tile0,
                       int row_blocks, int tiles, const float* __restrict__ srow,
                       const __grid_constant__ CUtensorMap xmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(S >= 3 && (BNX == 64 || BNX == 128 || BNX == 256), "ring and tile");
  constexpr int kX = BNX * kTileK * 2, kRR = 8, kC = kBigConsumers;
  static_assert(kX == BNX * 128, "a warpgroup's output half is one x stage");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (sraw + 1023) & ~1023u;  // the 128-byte swizzle repeats every 1024
  uint8_t* const sbase = smem_raw + (base - sraw);
  const uint32_t raw0 = base + S * kX, bar0 = raw0 + kRR * kC * 16, lo0 = wg_desc_lo(base);
  auto full = [&](int st) { return bar0 + 8u * st; };
  auto empty = [&](int st) { return bar0 + 8u * (S + st); };
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  // split z of gridDim.z takes k tiles [kb, kb + kt_count)
  const int kb = (int)((int64_t)kt_total * blockIdx.z / gridDim.z);
  const int kt_count = (int)((int64_t)kt_total * (blockIdx.z + 1) / gridDim.z) - kb;
  // this block's tiles, and each one's k steps in the ring (P: whole rounds of S)
  const int my_tiles = P ? (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x : 1;
  const int kt_ring = P ? (kt_count + S - 1) / S * S : kt_count;
  auto tile_of = [&](int i) { return tile0 + (int)blockIdx.x + i * (int)gridDim.x; };
  if (tid == 0) {
    for (int st = 0; st < S; ++st) {
      mbar_init(full(st), 1);
      mbar_init(empty(st), kC);
    }
  }
  __syncthreads();

  if (wg == 2) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    if (tid != kC) return;
    pdl_wait();  // x may come from the kernel before
    for (int i = 0, g0 = 0; i < my_tiles; ++i, g0 += kt_ring) {
      const int m0 = (tile_of(i) % row_blocks) * BNX;
      for (int kt = 0; kt < kt_ring; ++kt) {
        // stage st last held ring step gk - S: its release is that stage's (gk / S - 1)-th phase
        const int gk = g0 + kt, st = gk % S;
        if (gk >= S) mbar_wait(empty(st), ((gk / S) + 1) & 1);
        if (kt >= kt_count) {  // a pad step: complete the phase, load nothing
          mbar_arrive(full(st));
          continue;
        }
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(full(st)),
                     "r"(kX) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3}], [%4];" ::"r"(base + st * kX),
            "l"(reinterpret_cast<uint64_t>(&xmap)), "r"((kb + kt) * kTileK), "r"(m0), "r"(full(st))
            : "memory");
      }
    }
    return;  // nothing below synchronizes the block
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");

  const int g = lane >> 2, t = lane & 3;
  const int flo = 2 * (warp & 1);  // this warp's channels 8 f + g, f = flo, flo + 1
  auto weights_of = [&](int tl) {  // this lane's pieces of tile tl's weight tile
    const int tile = tl / row_blocks * 4 + wg * 2 + (warp >> 1);
    return w + ((int64_t)min(tile, nt_count - 1) * kt_total + kb) * 32 + lane;
  };
  // prmt picks bytes flo / 2 (h = 0) and 2 + flo / 2 (h = 1) of the k-half-0 word A and the
  // k-half-1 word B, as A B A B: then (f, u) sits at bit 8 u + 4 (f - flo) + 2 u' + 16 h
  // (selector nibbles fb, 4 + fb, 2 + fb, 6 + fb: one multiply-add where the loop rebuilds it)
  const uint32_t sel = 0x6240u + 0x1111u * (uint32_t)(flo >> 1);
  auto decode = [&](const uint4& q, uint32_t (&a)[4][4]) { wg_big_decode<T>(q, a, t, sel); };
  float d[BNX / 2];
  uint32_t a[2][4][4];
  uint4 q[2];
  const uint4* wt = weights_of(tile_of(0));
  auto rawload = [&](int kt) { raw_issue<kRR, kC>(raw0, tid, wt, kt, kt_count); };
  auto rawread = [&](int kt) { return raw_piece<kRR, kC>(sbase + S * kX, tid, kt, kt_count); };
#pragma unroll
  for (int p = 0; p < kRR - 2; ++p) rawload(p);
  pdl_wait();  // before any write of y or the workspace
  for (int i = 0, g0 = 0; i < my_tiles; ++i, g0 += kt_ring) {
    const int tl = tile_of(i), cb0 = tl / row_blocks * 128, m0 = (tl % row_blocks) * BNX;
    zero(d);
    // this tile's first kRR - 2 weight pieces are in flight (issued above or before the last
    // tile's epilogue)
    cp_async_wait<kRR - 3>();
    decode(rawread(0), a[0]);
    if constexpr (ABL == 1 || ABL == 2) decode(rawread(0), a[1]);
    cp_async_wait<kRR - 4>();
    q[1] = rawread(1);
    // step kt: wgmma(kt) on stage st = kt % S (phase ph) and A(kt); after wgmma(kt - 1)
    // retired its stage is released (P: not the tile's second last, which holds half the
    // output tile) and A(kt + 1) is decoded from the raw piece read last step. The loop is
    // unrolled over the S stages (twice for an odd S, since the A and raw-piece buffers
    // alternate): stage indices, descriptors and barrier addresses are fixed at compile time
    // and the parity flips once a round of S.
    constexpr int kU = S % 2 ? 2 * S : S;
    auto step = [&](int kt, int st, uint32_t ph, uint32_t (&acur)[4][4], uint32_t (&anext)[4][4],
                    const uint4& qcur, uint4& qnext) {
      mbar_wait(full(st), ph);
      wg_mma_tile<T, BNX, ABL != 3>(d, acur, lo0 + st * (kX >> 4));
      if (kt >= 1 && (!P || kt + 1 < kt_count)) mbar_arrive(empty((st + S - 1) % S));
      wg_pin(anext);
      if constexpr (ABL != 1 && ABL != 2) decode(qcur, anext);
      wg_pin(acur);
      wg_pin(d);
      if constexpr (ABL != 2) {
        cp_async_wait<kRR - 5>();  // raw tile kt + 2 (this thread's own piece)
        qnext = rawread(kt + 2);
        rawload(kt + kRR - 2);
      }
    };
    for (int kt0 = 0, ph = (g0 / S) & 1; kt0 < kt_count; kt0 += kU, ph ^= (kU / S) & 1) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (kt0 + u >= kt_count) break;
        step(kt0 + u, u % S, ph ^ ((u / S) & 1), a[u & 1], a[(u + 1) & 1], q[(u + 1) & 1],
             q[u & 1]);
      }
    }
    static_assert(S * kX >= BNX * 256, "the output tile reuses the x ring");
    pdl_trigger();
    if constexpr (!P) {
      if (ws == nullptr)
        wg_store_tile<T, BNX>(d, a, wg, warp, lane, m0, cb0, m, n, scale, per_tensor, bias,
                              base + wg * kX, sbase + wg * kX, y, kBigHiUnscale, true, srow);
      else  // (with srow the parts are unscaled: the finish kernel applies the epilogue)
        wg_store_part<BNX>(d, a, tid, cb0 + wg * 64 + 16 * warp + g, n, srow ? nullptr : scale,
                           per_tensor,
                           ws + ((int64_t)blockIdx.z * gridDim.x + blockIdx.x) * BNX * 128,
                           kBigHiUnscale);
    } else {
      // release the pad stages now (the producer's way into the next tile), fetch the next
      // tile's first weight pieces (into slots this tile's reads are done with), store the
      // output through the two held stages, then release those. A pad stage is released only
      // once its "full" phase completed, i.e. once the producer has passed its empty wait:
      // released earlier, that stage's barrier could complete two phases before the producer
      // polls it, and the parity it waits for would then never come (a hang that
      // ternary.kernel_soak reproduces, e.g. at M = 16384, K = 5504).
      // That wait needs the pad's previous round released. Where the k tiles are one more
      // than whole rounds of S, the last pad's previous round is the first held stage: that
      // pad is released after the store (waiting for it here would wait on a producer that
      // waits for the held stage).
      const int held_pad = kt_count - 2 + S;  // the one pad whose last round is held, if any
      for (int kt = kt_count; kt < kt_ring; ++kt) {
        if (kt == held_pad) continue;
        mbar_wait(full(kt % S), (uint32_t)((g0 + kt) / S) & 1);
        mbar_arrive(empty(kt % S));
      }
      if (i + 1 < my_tiles) {
        wt = weights_of(tile_of(i + 1));
#pragma unroll
        for (int p = 0; p < kRR - 2; ++p) rawload(p);
      }
      const int last = (kt_count - 1) % S, mine = (last + S - 1 + wg) % S;
      wg_store_tile<T, BNX>(d, a, wg, warp, lane, m0, cb0, m, n, scale, per_tensor, bias,
                            base + mine * kX, sbase + mine * kX, y, kBigHiUnscale, false, srow);
      // this thread's reads of the output tile are done; the stages' next writer is the TMA
      // engine (async proxy)
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      mbar_arrive(empty((last + S - 1) % S));
      mbar_arrive(empty(last));
      if (held_pad < kt_ring) {
        mbar_wait(full(held_pad % S), (uint32_t)((g0 + held_pad) / S) & 1);
        mbar_arrive(empty(held_pad % S));
      }
    }
  }
#endif
}

// y of tiles tile0 .. tile0 + tiles - 1 = their split-K parts summed in split order + bias. A
// thread takes one float4 of the parts (wg_store_part's order): consumer thread tid's
// accumulators d[4 j .. 4 j + 3], tokens 8 j + 2 t + (0, 1) of channels
// 64 wg + 16 warp + g + (0, 8). srow (ternary::linear_a8's; the parts then unscaled integer
// sums): gemm_a8's epilogue with scale, per_tensor and srow (common/epilogue.cuh).
template <typename T, int BNX>
__global__ void wgmma_big_finish_kernel(const float* __restrict__ ws, const T* __restrict__ bias,
                                        T* __restrict__ y, int m, int n, int tile0,
                                        int row_blocks, int tiles, int splits,
                                        const float* __restrict__ scale, bool per_tensor,
                                        const float* __restrict__ srow) {
  constexpr int64_t kPer4 = (int64_t)BNX * 128 / 4;
  pdl_wait();  // the split parts
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= tiles * kPer4) return;
  const int b = (int)(i / kPer4), q = (int)(i % kPer4), j = q / kBigConsumers,
            tid = q % kBigConsumers;
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int tl = tile0 + b;
  const int row0 = (tl % row_blocks) * BNX + 8 * j + 2 * t;
  const int col0 = (tl / row_blocks) * 128 + 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + g;
  const float4* w4 = reinterpret_cast<const float4*>(ws);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int z = 0; z < splits; ++z) {
    const float4 v = w4[((int64_t)z * tiles + b) * kPer4 + q];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  const float vals[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int col = col0 + 8 * hi;
    if (col >= n) continue;
    const float bc = bias ? to_float(bias[col]) : 0.f;
    const float sc = srow ? scale[per_tensor ? 0 : col] : 1.f;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = row0 + e;
      if (row >= m) continue;
      y[(int64_t)row * n + col] =
          from_float<T>(srow ? epilogue(vals[2 * hi + e], sc, bc, bias != nullptr, srow, row)
                             : vals[2 * hi + e] + bc);
    }
  }
}

// fused_wgmma_big_kernel's dynamic shared memory: the x ring, the weight ring, the barriers and
// the slack for its 1024-byte alignment
template <int BNX, int S> constexpr int wgmma_big_smem() {
  return S * BNX * kTileK * 2 + 8 * kBigConsumers * 16 + 2 * S * 8 + 1024;
}

}  // namespace TERNARY_TU

// tail 0: every tile split `splits` ways (1: none). tail > 0: the first tiles unsplit, then
// the last `tail` tiles (the partial wave) split `splits` ways in a second launch.
template <typename T, int BNX, int S, int ABL>
cudaError_t launch_wgmma_big(const void* x, int64_t ldx, const uint8_t* repacked,
                             const float* scale, const void* bias, void* y, int64_t m, int64_t n,
                             int64_t k, bool per_tensor, int splits, int64_t tail, float* ws,
                             int num_sms, cudaStream_t stream, const float* srow) {
  if (m > INT32_MAX - 512 || n > INT32_MAX - 512 || k > INT32_MAX - 64) return cudaErrorInvalidValue;
  // TMA: a 16-byte aligned base and row stride
  if (k % kTileK || ldx % 8 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  if (splits < 1 || splits > 64 || (splits > 1 && ws == nullptr)) return cudaErrorInvalidValue;
  constexpr int kSmem = wgmma_big_smem<BNX, S>();
  auto kernel = fused_wgmma_big_kernel<T, BNX, S, false, ABL>;
  // persistent only with 256-token tiles: there it gains 1-4 % over one tile a block, with
  // 128-token tiles it loses 3-4 % (docs/kernels.md)
  auto persistent = fused_wgmma_big_kernel<T, BNX, S, BNX == kBigRows, ABL>;
  for (auto f : {kernel, persistent}) {
    const cudaError_t attr =
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (attr != cudaSuccess) return attr;
  }
  const int sms = num_sms;  // the caller's count (ops.cpp: the current device's properties)
  if (sms < 1) return cudaErrorInvalidValue;
  const int64_t mb = (m + BNX - 1) / BNX, nb = (n + 127) / 128, tiles = mb * nb;
  if (tiles > INT32_MAX / 2 || tail < 0 || tail > tiles) return cudaErrorInvalidConfiguration;
  CUtensorMap xmap{};
  if (!x_tensor_map<T>(&xmap, x, ldx, m, k, BNX)) return cudaErrorInvalidValue;
  // The call's first launch is plain for activation none (the kernel before it, another
  // op's, triggers nothing, so it gains nothing from early launch) and programmatic with srow
  // (linear_a8's quantize before it triggers at its start); the launches that follow it
  // within this call (the split tail after the whole tiles, the finish kernel after its split
  // parts) are programmatic dependents (pdl_wait): their prologues overlap the kernel before
  // them, worth 7-12 % at M = 64 (docs/kernels.md).
  const bool first = srow != nullptr;
  auto run = [&](int64_t tile0, int64_t count, int z, bool follows) {
    const bool p = wgmma_big_persistent(BNX, z, count, sms, k / kTileK);
    const dim3 grid((unsigned)(p ? sms : count), 1, (unsigned)z);
    cudaError_t e = launch_k(p ? persistent : kernel, grid, dim3(384), kSmem, stream, follows,
                             reinterpret_cast<const uint4*>(repacked), scale, (const T*)bias,
                             (T*)y, z > 1 ? ws : nullptr, (int)m, (int)n, (int)(k / kTileK),
                             (int)((n + kTileN - 1) / kTileN), per_tensor, (int)tile0, (int)mb,
                             (int)count, srow, xmap);
    if (e == cudaSuccess && z > 1) {
      const int64_t total = count * BNX * 128 / 4;  // a thread a float4
      e = launch_k(wgmma_big_finish_kernel<T, BNX>, dim3((unsigned)((total + 255) / 256)),
                   dim3(256), 0, stream, true, ws, (const T*)bias, (T*)y, (int)m, (int)n,
                   (int)tile0, (int)mb, (int)count, z, scale, per_tensor, srow);
    }
    return e;
  };
  cudaError_t e = cudaSuccess;
  if (tail > 0 && splits > 1) {
    if (tiles > tail) e = run(0, tiles - tail, 1, first);
    if (e == cudaSuccess) e = run(tiles - tail, tail, splits, first || tiles > tail);
  } else {
    e = run(0, tiles, splits, first);
  }
  return e;
}

}  // namespace ternary
