#define TERNARY_TU gemm_a8_tc_cu  // this file's namespace (common/tu.cuh)
// W1.58A8 on int8 tensor cores from the fused kernels' repacked weights (common/layout.cuh):
// y[m, n] = (sum_k xq[m, k] * w[n, k]) * w_scale / s[m] + bias, mma.sync m16n8k32 s8, int32
// sums (exact: |sum| <= 128 * K), one float32 epilogue in ternary.ops._gemm_a8_ref's order.
// Every arch from sm_80 on. A layer keeps one weight copy: the one linear_fused reads.
//
// A block takes 128 tokens x 128 channels; 8 warps, 2 (tokens) x 4 (channels), each 64 x 32:
// 4 m16 x 4 n8 tiles, which is one 32-channel repacked tile a warp. For each 64-wide k tile:
//  - x: the block's 128 x 64 int8 tile arrives in shared memory by cp.async, kStages deep
//    (zero-filled past m and k), rows 64 bytes apart: a quarter-warp's 16-byte reads cover two
//    whole rows, so they hit 32 distinct banks;
//  - w: each lane loads its own 16 bytes of its warp's 512-byte repacked tile straight from
//    global memory (one coalesced load a warp; the next k tile's is in flight meanwhile).
// The repacked layout gives lane (g, t) the codes of k = 16 t + (0..15) for its 4 n8 tiles.
// The mma's k positions are matched to them by permuting k inside each 32-wide step, for A
// and B alike: in step s, b0 / b1 (mma k 4 t + i / 16 + 4 t + i) hold k = 16 t + 8 s + i /
// 16 t + 8 s + 4 + i, so lane (g, t)'s A words are x[row][16 t .. 16 t + 15] of rows g and
// g + 8, four consecutive words, used as they are.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/layout.cuh"
#include "common/tu.cuh"
#include "dtype.cuh"
#include "kernels.h"

namespace ternary {
inline namespace TERNARY_TU {

constexpr int kBM = 128, kBN = 128, kBK = 64;  // tokens, channels, k a block tile
constexpr int kStages = 4;                     // x tiles in flight (8 KB each)
constexpr int kThreads = 256;

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared, or 16 zero bytes when !valid (src-size 0 reads nothing)
__device__ __forceinline__ void cp_async16_zfill(uint32_t smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_groups() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// One 32-bit word of a lane's repacked piece (its k = 16 t + 4 w + (0..3) for 4 n8 tiles:
// code of k offset 2 r + h of tile f at bit 16 h + 4 f + 2 r) -> the 4 int8 weights of tile f
// in k order: bytes 0..3 = offsets 0..3.
__device__ __forceinline__ uint32_t decode_word(uint32_t w, int f) {
  const uint32_t v = w >> (4 * f);
  const uint32_t lo = v & 0x00030003u;         // byte 0: offset 0, byte 2: offset 1
  const uint32_t hi = (v >> 2) & 0x00030003u;  // byte 0: offset 2, byte 2: offset 3
  const uint32_t c = __byte_perm(lo, hi, 0x6420);
  // codes 0, 1, 2 -> int8 -1, 0, 1 in every byte: c + 0x7f stays below 0x100 (no carry)
  return (c + 0x7f7f7f7fu) ^ 0x80808080u;
}

// OutT int32_t: the raw sums (the exactness check); otherwise the float32 epilogue.
template <typename OutT>
__global__ void __launch_bounds__(kThreads)
gemm_a8_tc_kernel(const int8_t* __restrict__ xq, const float* __restrict__ s,
                  const uint8_t* __restrict__ repacked, const float* __restrict__ scale,
                  const OutT* __restrict__ bias, OutT* __restrict__ y, int m, int n, int k,
                  bool per_tensor) {
  __shared__ __align__(128) int8_t xs[kStages][kBM * kBK];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const int kt_count = (k + kBK - 1) / kBK;

  // this warp's repacked tile row (32 channels): its k tiles follow each other, 512 bytes
  const int nt = (n0 + wn) / kTileN;
  const bool w_live = n0 + wn < n;
  const uint4* wsrc = reinterpret_cast<const uint4*>(repacked) +
                      ((int64_t)nt * kt_count) * (kTileBytes / 16) + lane;

  // x loader: chunk c = tid + 256 i of a tile is row c / 4, bytes 16 (c % 4) ..
  const uint32_t xs0 = static_cast<uint32_t>(__cvta_generic_to_shared(&xs[0][0]));
  auto issue_x = [&](int kt) {
    if (kt < kt_count) {
      const int slot = kt % kStages;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = tid + i * kThreads, row = c >> 2, col = kt * kBK + (c & 3) * 16;
        const bool ok = m0 + row < m && col < k;
        const int8_t* src = ok ? xq + (int64_t)(m0 + row) * k + col : xq;
        cp_async16_zfill(xs0 + slot * (kBM * kBK) + row * kBK + (c & 3) * 16, src, ok);
      }
    }
    commit();  // empty past the end: the group count stays the step count
  };

  int acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][f][r] = 0;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) issue_x(st);
  uint4 wnext = w_live ? wsrc[0] : make_uint4(0, 0, 0, 0);

  for (int kt = 0; kt < kt_count; ++kt) {
    const uint4 wcur = wnext;
    if (w_live && kt + 1 < kt_count) wnext = wsrc[(int64_t)(kt + 1) * (kTileBytes / 16)];
    wait_groups<kStages - 2>();  // tile kt has landed (this thread's pieces)
    __syncthreads();             // ... and every thread's; slot (kt - 1) % kStages is free
    issue_x(kt + kStages - 1);

    // B of both k32 steps: step s, b0 from word 2 s, b1 from word 2 s + 1
    uint32_t b[4][4];
    const uint32_t wwords[4] = {wcur.x, wcur.y, wcur.z, wcur.w};
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int q = 0; q < 4; ++q) b[f][q] = decode_word(wwords[q], f);

    const int8_t* tile = &xs[kt % kStages][0];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 lo = *reinterpret_cast<const uint4*>(tile + (wm + i * 16 + g) * kBK + t * 16);
      const uint4 hi = *reinterpret_cast<const uint4*>(tile + (wm + i * 16 + g + 8) * kBK + t * 16);
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        mma_s8(acc[i][f], lo.x, hi.x, lo.y, hi.y, b[f][0], b[f][1]);  // step 0
        mma_s8(acc[i][f], lo.z, hi.z, lo.w, hi.w, b[f][2], b[f][3]);  // step 1
      }
    }
  }
  wait_groups<0>();  // no copy outlives the block (the groups past the end are empty)

  // c0, c1: row g, columns 2 t + (0, 1); c2, c3: row g + 8
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + wm + i * 16 + g + h * 8;
      if (row >= m) continue;
      const float s_row = s[row];
#pragma unroll
      for (int f = 0; f < 4; ++f)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n0 + wn + f * 8 + t * 2 + e;
          if (col >= n) continue;
          const int v = acc[i][f][h * 2 + e];
          OutT* out = y + (int64_t)row * n + col;
          if constexpr (std::is_same_v<OutT, int32_t>) {
            *out = v;
          } else {
            float fv = (float)v * (per_tensor ? scale[0] : scale[col]) / s_row;
            if (bias) fv += to_float(bias[col]);
            *out = from_float<OutT>(fv);
          }
        }
    }
}

template <typename OutT>
cudaError_t launch_typed(const int8_t* xq, const float* s, const uint8_t* repacked,
                         const float* scale, const void* bias, void* y, int64_t m, int64_t n,
                         int64_t k, bool per_tensor, cudaStream_t stream) {
  const dim3 grid((unsigned)((n + kBN - 1) / kBN), (unsigned)((m + kBM - 1) / kBM));
  gemm_a8_tc_kernel<OutT><<<grid, kThreads, 0, stream>>>(
      xq, s, repacked, scale, (const OutT*)bias, (OutT*)y, (int)m, (int)n, (int)k, per_tensor);
  return cudaGetLastError();
}

}  // namespace TERNARY_TU

cudaError_t launch_gemm_a8_repacked(const int8_t* xq, const float* s, const uint8_t* repacked,
                                    const float* scale, const void* bias, void* y, A8Out out,
                                    int64_t m, int64_t n, int64_t k, bool per_tensor,
                                    cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  // x rows are copied in 16-byte pieces: k % 16 == 0 and a 16-byte aligned start (the caller
  // pads other k); m, n, k as int inside the kernel; the grid's y holds 65535 token tiles
  if (k % 16 || reinterpret_cast<uintptr_t>(xq) % 16 || reinterpret_cast<uintptr_t>(repacked) % 16 ||
      k >= (int64_t)1 << 31 || n >= (int64_t)1 << 31 || m > (int64_t)65535 * kBM)
    return cudaErrorInvalidValue;
  switch (out) {
    case A8Out::kHalf:
      return launch_typed<__half>(xq, s, repacked, scale, bias, y, m, n, k, per_tensor, stream);
    case A8Out::kBFloat16:
      return launch_typed<__nv_bfloat16>(xq, s, repacked, scale, bias, y, m, n, k, per_tensor,
                                         stream);
    case A8Out::kFloat:
      return launch_typed<float>(xq, s, repacked, scale, bias, y, m, n, k, per_tensor, stream);
    case A8Out::kInt32:
      return launch_typed<int32_t>(xq, s, repacked, scale, bias, y, m, n, k, per_tensor, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ternary
