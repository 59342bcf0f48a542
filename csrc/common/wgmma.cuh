// Hopper (sm_90a) building blocks of the wgmma kernels: the magic-number decode into A
// fragments, wgmma m64nNk16 with A from registers, shared-memory descriptors, the epilogues
// and the mbarrier ring. Everything here exists in the sm_90a pass only.
#pragma once

#include "common/tu.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/async.cuh"
#include "common/epilogue.cuh"
#include "common/launch.cuh"
#include "common/layout.cuh"
#include "dtype.cuh"

namespace ternary {
inline namespace TERNARY_TU {

// wgmma_big's consumer threads (two warpgroups of 64 channels each): the kernel, its split-K
// part layout (wg_store_part) and wgmma_big_finish_kernel
constexpr int kBigConsumers = 256;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // (helpers of the sm_90a body only)
template <typename T> struct WgDec;
template <> struct WgDec<__nv_bfloat16> {
  static constexpr uint32_t kMagic = 0x43004300u;  // 128 in both halves: ulp 1
  static constexpr uint32_t kSub = 0xC301C301u;    // -129
  static constexpr uint32_t kSub16 = 0xC310C310u;  // -144: a code read at bits 4-5 (16 c)
};
template <> struct WgDec<__half> {
  static constexpr uint32_t kMagic = 0x64006400u;  // 1024: ulp 1
  static constexpr uint32_t kSub = 0xE401E401u;    // -1025
  static constexpr uint32_t kSub16 = 0xE410E410u;  // -1040
};

__device__ __forceinline__ uint32_t add_x2(__nv_bfloat16*, uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t add_x2(__half*, uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

constexpr float kBigHiUnscale = 0.0625f;  // wgmma_big's A rows g + 8 are decoded as 16 (c - 1)
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;  // (a & b) | c
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// wgmma shared-memory descriptor: 128-byte swizzle (layout type 1), LBO unused (1), SBO 1024
// (8 rows of 128 bytes). Kept as its low word (start address >> 4 in bits 0-13, LBO) and a
// constant high word: shared addresses stay under 256 KB, so a k16 step or a ring stage is an
// add to the low word with no carry out of the start field. (Rebuilt from the address before
// each wgmma, the descriptors would be 24 of the 148 instructions a warp runs per k tile at
// 64 tokens.)
__device__ __forceinline__ uint32_t wg_desc_lo(uint32_t saddr) {
  return ((saddr & 0x3FFFF) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t wg_desc(uint32_t lo) {
  return ((uint64_t)((1024 >> 4) | (1u << 30)) << 32) | lo;
}
// a k16 step inside a 64-wide, 128-byte swizzled k tile: 32 bytes, in descriptor units
constexpr uint32_t kWgStepLo = 32 >> 4;

// wgmma m64nNk16 with A from registers (a0..a3: the m16n8k16 A fragment of the warp's 16
// rows) and B from shared memory (descriptor), D += A B in fp32 registers
template <typename T, int N> struct WgmmaRS;
// Operands of m64n64 (32 accumulators) and m64n128 (64): D, then A and the descriptor, then
// the scale-d flag
#define TERNARY_WG_D64_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define TERNARY_WG_D64_TAIL "{%32, %33, %34, %35}, %36"
#define TERNARY_WG_D64_PRED "%37"
#define TERNARY_WG_D64_OUTS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define TERNARY_WG_D128_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define TERNARY_WG_D128_TAIL "{%64, %65, %66, %67}, %68"
#define TERNARY_WG_D128_PRED "%69"
#define TERNARY_WG_D128_OUTS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define TERNARY_WG_D256_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define TERNARY_WG_D256_TAIL "{%128, %129, %130, %131}, %132"
#define TERNARY_WG_D256_PRED "%133"
#define TERNARY_WG_D256_OUTS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define TERNARY_WGMMA_RS(TYPE, PTX, N)                                                          \
  template <> struct WgmmaRS<TYPE, N> {                                                       \
    static __device__ __forceinline__ void run(float (&d)[N / 2], const uint32_t (&a)[4],     \
                                               uint64_t db) {                                 \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " TERNARY_WG_D##N##_PRED ", 0;\n"         \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " "          \
                   TERNARY_WG_D##N##_REGS ", " TERNARY_WG_D##N##_TAIL ", p, 1, 1, 0;\n}\n"    \
                   : TERNARY_WG_D##N##_OUTS                                                   \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));            \
    }                                                                                         \
  };
TERNARY_WGMMA_RS(__nv_bfloat16, "bf16", 64)
TERNARY_WGMMA_RS(__nv_bfloat16, "bf16", 128)
TERNARY_WGMMA_RS(__half, "f16", 64)
TERNARY_WGMMA_RS(__half, "f16", 128)
TERNARY_WGMMA_RS(__nv_bfloat16, "bf16", 256)
TERNARY_WGMMA_RS(__half, "f16", 256)
#undef TERNARY_WGMMA_RS

// Keeps a k tile of A fragments in its registers (no instruction): the decode of the next tile
// must not be moved across the wgmma that still reads this one.
__device__ __forceinline__ void wg_pin(uint32_t (&a)[4][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[s][i])::"memory");
}

// ... and the accumulators, which an in-flight wgmma still writes
template <int N> __device__ __forceinline__ void wg_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// wgmma_big's decode of a lane's raw piece q into the A fragments of its k tile's four k16
// steps; t = lane % 4, sel picks the bytes of the warp's channels (fused_wgmma_big_kernel).
// A source lane s (its piece: k 16 s .. 16 s + 15, the k16 step s) packs two words, P0 from
// its words 0 and 2 for receivers t = 0, 1 and P1 from words 1 and 3 for t = 2, 3. One xor
// shuffle puts each lane's P1 on its partner t ^ 2, so r01 holds step 0 and 1's words on
// lanes 0, 1 (P0) and 2, 3 (P1), and r23 those of steps 2 and 3: a step is then one
// indexed shuffle from lane s ^ (t & 2), rather than four prmt rounds, each tailored to its
// receiver, and three selects a step to find it.
template <typename T>
__device__ __forceinline__ void wg_big_decode(const uint4& q, uint32_t (&a)[4][4], int t,
                                            uint32_t sel) {
  uint32_t p0, p1;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(p0) : "r"(q.x), "r"(q.z), "r"(sel));
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(p1) : "r"(q.y), "r"(q.w), "r"(sel));
  const uint32_t p1x = __shfl_xor_sync(0xffffffffu, p1, 2);
  const uint32_t r01 = (t & 2) ? p1x : p0, r23 = (t & 2) ? p0 : p1x;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t x = __shfl_sync(0xffffffffu, s < 2 ? r01 : r23, s ^ (t & 2), 4);
    const uint32_t word = x >> (2 * (t & 1));  // u' = t % 2
    // f = flo + (i & 1), u = i >> 1. Odd i are the A rows g + 8: read in place at bits 4-5,
    // as 16 (c - 1) (exact), which the epilogue's scale of those rows takes back out
    // (kBigHiUnscale), so a word takes one shift instead of three
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = (i >> 1) ? word >> 8 : word;
      a[s][i] = add_x2((T*)nullptr,
                       lop3_and_or(v, (i & 1) ? 0x00300030u : 0x00030003u, WgDec<T>::kMagic),
                       (i & 1) ? WgDec<T>::kSub16 : WgDec<T>::kSub);
    }
  }
}

// One k tile of both wgmma kernels: the four k16 steps of A (registers) against the x stage
// whose descriptor low word is stage_lo, committed as one group; returns once the previous
// group retired (this one stays in flight while the caller decodes the next A).
template <typename T, int BNX, bool MMA = true>
__device__ __forceinline__ void wg_mma_tile(float (&d)[BNX / 2], uint32_t (&acur)[4][4],
                                            uint32_t stage_lo) {
  wg_pin(d);
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int s = 0; s < 4; ++s)
    if constexpr (MMA) WgmmaRS<T, BNX>::run(d, acur[s], wg_desc(stage_lo + kWgStepLo * s));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}

// wgmma_rs's end under split K (wgmma_big's is wg_store_part; whole tiles leave through
// wg_store_tile): wait for the last wgmma, then write this thread's share of the warp's
// m64nBNX accumulators, scaled, into its split's fp32 part [m][n] of the workspace. Channels
// ch0 and ch0 + 8, tokens m0 + 8 j + 2 t + e.
template <int BNX>
__device__ __forceinline__ void wg_finish(float (&d)[BNX / 2], uint32_t (&a)[2][4][4], int ch0,
                                          int m0, int t, int m, int n, const float* scale,
                                          bool per_tensor, float* part) {
  cp_async_wait<0>();
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_pin(a[0]);
  wg_pin(a[1]);
  wg_pin(d);
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int col = ch0 + 8 * hi;
    if (col >= n) continue;
    const float sc = per_tensor ? scale[0] : scale[col];
#pragma unroll
    for (int j = 0; j < BNX / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = m0 + 8 * j + 2 * t + e;
        if (row < m) part[(int64_t)row * n + col] = d[4 * j + 2 * hi + e] * sc;
      }
  }
}

// wgmma_big's split-K part of a tile, in the accumulators' own order: thread tid's
// d[4 j .. 4 j + 3], scaled, is float4 j * kBigConsumers + tid of the tile's BNX x 128
// floats, so each warp store writes 512 whole bytes (wgmma_big_finish_kernel maps them back
// to tokens and channels). Written element by element at their (token, channel) places, the
// parts would take 18.6 % of the warp samples at M = 64 with K split 4. scale null
// (ternary::linear_a8's): the parts stay integer sums (hi_mul, a power of two, taken out), so
// their sum is exact and the finish kernel applies gemm_a8's epilogue once.
template <int BNX>
__device__ __forceinline__ void wg_store_part(float (&d)[BNX / 2], uint32_t (&a)[2][4][4],
                                              int tid, int ch0, int n, const float* scale,
                                              bool per_tensor, float* part, float hi_mul) {
  cp_async_wait<0>();
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_pin(a[0]);
  wg_pin(a[1]);
  wg_pin(d);
  float sc[2];
#pragma unroll
  for (int hi = 0; hi < 2; ++hi)
    sc[hi] = ch0 + 8 * hi >= n ? 0.f
             : (scale ? scale[per_tensor ? 0 : ch0 + 8 * hi] : 1.f) * (hi ? hi_mul : 1.f);
  float4* p4 = reinterpret_cast<float4*>(part) + tid;
#pragma unroll
  for (int j = 0; j < BNX / 8; ++j)
    p4[j * kBigConsumers] = make_float4(d[4 * j] * sc[0], d[4 * j + 1] * sc[0],
                                        d[4 * j + 2] * sc[1], d[4 * j + 3] * sc[1]);
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const T l = from_float<T>(lo), h = from_float<T>(hi);
  return (uint32_t)reinterpret_cast<const uint16_t&>(l) |
         ((uint32_t)reinterpret_cast<const uint16_t&>(h) << 16);
}

// The large-M kernels' end without split K: both consumer warpgroups' accumulators, scaled
// and biased, go through shared memory to leave as 16-byte stores of whole token rows, in a
// rolled loop. (Per-element stores, as wg_finish's, unroll into 2866 SASS instructions run
// once a warp, which stall on instruction fetch.) stmatrix .trans turns each
// 8 x 8 fragment (channels x tokens) into 8 token rows of 8 channels. Each warpgroup's 64
// channels are a [BNX tokens][128 bytes] tile of their own at shared address shalf (generic
// ghalf), one x stage's size, so the persistent wgmma_big can put them in the two stages it
// still holds; 16-byte chunk c of a row sits at c ^ (token % 8), so the 8 rows of one
// stmatrix fall in different banks. The shared memory it overwrites must first be done with
// by both warpgroups' wgmma. wait_raw: first wait for this thread's cp.async groups (those
// kernels whose rings the tile overlaps, or that end here). srow: ternary::linear_a8's per-row
// s (x the integer-valued x_q), null for activation none (common/epilogue.cuh).
template <typename T, int BNX>
__device__ __forceinline__ void wg_store_tile(float (&d)[BNX / 2], uint32_t (&a)[2][4][4],
                                              int wg, int warp, int lane, int m0, int cb0,
                                              int m, int n, const float* scale, bool per_tensor,
                                              const T* bias, uint32_t shalf, const uint8_t* ghalf,
                                              T* y, float hi_mul = 1.f, bool wait_raw = true,
                                              const float* srow = nullptr) {
  if (wait_raw) cp_async_wait<0>();
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_pin(a[0]);
  wg_pin(a[1]);
  wg_pin(d);
  const int g = lane >> 2;
  float sc[2], b[2];
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int col = cb0 + 64 * wg + 16 * warp + 8 * hi + g;
    sc[hi] = col < n ? scale[per_tensor ? 0 : col] * (hi ? hi_mul : 1.f) : 0.f;
    b[hi] = bias && col < n ? to_float(bias[col]) : 0.f;
  }
  asm volatile("bar.sync 1, 256;" ::: "memory");  // both warpgroups' last wgmma retired
  // matrix q of stmatrix x4: channels 8 (q % 2) + 0..7 of this warp, tokens 8 (2 jj + q / 2)
  // + 0..7; lane 8 q + i gives the address of token row i
  const int q = lane >> 3, i = lane & 7, c = 2 * warp + (q & 1);
  // d[4 j + 2 hi + e] is token 8 j + 2 t + e; its s (rows past m read row m - 1's, unstored)
  const int t2 = 2 * (lane & 3);
  const bool has_bias = bias != nullptr;
  auto out = [&](float acc, int hi, int tok) {
    return epilogue(acc, sc[hi], b[hi], has_bias, srow, min(m0 + tok, m - 1));
  };
#pragma unroll
  for (int jj = 0; jj < BNX / 16; ++jj) {
    uint32_t r[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int j = 2 * jj + (p >> 1), hi = p & 1;
      r[p] = pack2<T>(out(d[4 * j + 2 * hi], hi, 8 * j + t2),
                      out(d[4 * j + 2 * hi + 1], hi, 8 * j + t2 + 1));
    }
    const int tk = 8 * (2 * jj + (q >> 1)) + i;
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     shalf + tk * 128 + ((c ^ (tk & 7)) << 4)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
  }
  asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");
  const int tw = 32 * warp + lane;
  const bool vec = n % 8 == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0;
#pragma unroll 1
  for (int id = tw; id < BNX * 8; id += 128) {
    const int tk = id >> 3, cc = id & 7, row = m0 + tk, col = cb0 + 64 * wg + 8 * cc;
    if (row >= m || col >= n) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(ghalf + tk * 128 + ((cc ^ (tk & 7)) << 4));
    T* dst = y + (int64_t)row * n + col;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint16_t h = (uint16_t)(w4[k >> 1] >> (16 * (k & 1)));
        if (col + k < n) dst[k] = reinterpret_cast<const T&>(h);
      }
    }
  }
}

// mbarrier ring of the large-M kernel (producer -> consumers "full", consumers -> producer
// "empty"); a stage's phase parity flips each time the ring comes round
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
#endif

}  // namespace TERNARY_TU
}  // namespace ternary
