// The fused ternary gemm: unpack, dequantize and multiply in one pass over a weight layout
// made for it at load time (repack), with no dense weight anywhere in memory.
//
// Layout ("repacked", uint8 [ceil(N/32), ceil(K/64), 512]): one 512-byte tile per 32 output
// channels x 64 inputs, 16 bytes per lane of a warp, so a warp reads a tile with one
// coalesced 16-byte load per lane and each lane gets exactly the codes of its mma.sync
// m16n8k16 B fragments (4 n8 fragments x 4 k16 steps). Inside lane (g = lane/4, t = lane%4)'s
// 16 bytes, 32-bit word w, pair j = 2f + r, half h: bits 16h + 2j hold the code of
//   n = 32 nt + 8 f + g,   k = 64 kt + 16 t + 4 w + 2 r + h.
// The k order is permuted inside a tile so that the same lane's A fragments (activations)
// are 16 consecutive elements of one x row: two 16-byte loads from L1, no shared memory.
// Codes outside [N, K] are 1 (w = 0).
//
// Decoding is LUT-free and has no arithmetic: `word & 0x00030003` read as a packed
// bfloat162/half2 is a pair of subnormals c * 2^-133 (bf16) or c * 2^-24 (fp16), where
// c = w + 1 in {0, 1, 2}: the value is linear in the bits while the exponent field is 0.
// So the mma sums x * c (scaled), and one more mma per k16 step against a constant
// fragment of ones sums x; y = (sum x*c - sum x) * 2^133 or 2^24 (folded into the scale).
// For bf16 the products x * c * 2^-133 would be fp32 subnormals, so x is pre-scaled by
// 2^100 (exact: a power of two). Pair r=1 of fragment f then sits at bits 4f+2, read as 4c
// without a shift; its x is pre-scaled by 2^98 instead. Per 32-bit word: 3 shifts and
// 8 ANDs for 16 weights (v2: 8 shifts, 8 ANDs/ORs and 8 subtractions).
#include <atomic>
#include <cstdlib>
#include <type_traits>
#include <cuda.h>  // CUtensorMap (the type only: the encoder comes from the runtime)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "dtype.cuh"
#include "kernels.h"

namespace ternary {
// Named, not anonymous: cudafe++ names an anonymous namespace after a hash of the
// checkout path, which would put the path into every kernel's symbol. Inline, so the
// names below read as before.
inline namespace fused_cu {

constexpr int kTileN = 32;
constexpr int kTileK = 64;
constexpr int kTileBytes = 512;
// wgmma_big's consumer threads (two warpgroups of 64 channels each): the kernel, its split-K
// part layout (wg_store_part) and wgmma_big_finish_kernel
constexpr int kBigConsumers = 256;

__global__ void repack_kernel(const uint8_t* __restrict__ packed, uint8_t* __restrict__ out,
                              int64_t n, int64_t k, int64_t kt_count, int64_t total) {
  const int64_t kb = k / 4;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t tile = i / kTileBytes;
    const int r = (int)(i % kTileBytes);
    const int64_t nt = tile / kt_count, kt = tile % kt_count;
    const int lane = r >> 4, byte = r & 15;
    const int g = lane >> 2, t = lane & 3;
    const int w = byte >> 2, h = (byte >> 1) & 1, fb = byte & 1;
    unsigned v = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int f = fb * 2 + (c >> 1), rr = c & 1;
      const int64_t nn = nt * kTileN + f * 8 + g;
      const int64_t kk = kt * kTileK + t * 16 + w * 4 + rr * 2 + h;
      unsigned code = 1;
      if (nn < n && kk < k) code = (packed[nn * kb + kk / 4] >> (2 * (kk % 4))) & 3u;
      v |= code << (2 * c);
    }
    out[i] = (uint8_t)v;
  }
}

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

// 16-byte global -> shared copy that bypasses L1 and the registers (a lane later reads back
// only what it copied itself, so no barrier is needed, only the group wait).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// "memory": the ring's shared-memory reads after the wait must not move above it.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Programmatic dependent launch (sm_90+). A kernel launched with pdl (launch_k) may start while
// the kernel before it in the stream is still running: it issues what depends on no earlier
// kernel (the weight stream: weights, scales and bias are written only at load time) and then
// pdl_wait()s, which returns once every earlier kernel has finished and its writes are visible.
// Every thread waits before it reads x or writes y or a workspace (an earlier kernel may
// produce x, or still read the memory y now occupies). pdl_trigger() (sm_90a bodies) lets
// the next kernel, where it was launched with pdl, start its own prologue. Launched without
// the attribute, or before sm_90, both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization
// attribute where pdl (which the caller sets only on sm_90+ devices). A launch the attribute
// makes fail (a driver or platform without programmatic launch; none seen so far) is made
// again plainly, which only orders it more strictly.
// Switches for bisecting a hang inside a serving engine (tools/h200 tp-hang), read once a
// process: TERNARY_PDL=0 launches every kernel plainly, TERNARY_PERSISTENT=0 gives
// wgmma_big one block a tile. Results are the same either way; only overlap and speed move.
bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '0' && v[1] == '\0';
}
bool pdl_allowed() {
  static const bool on = !env_off("TERNARY_PDL");
  return on;
}
bool persistent_allowed() {
  static const bool on = !env_off("TERNARY_PERSISTENT");
  return on;
}

template <typename... P, typename... A>
cudaError_t launch_k(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, bool pdl, const A&... args) {
  pdl = pdl && pdl_allowed();
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess && pdl) {
    (void)cudaGetLastError();
    cfg.numAttrs = 0;
    e = cudaLaunchKernelEx(&cfg, kernel, args...);
  }
  return e;
}

// The wgmma kernels' weight rings: each consumer thread cp.asyncs its own 16-byte piece of
// k tile kt (one commit group a tile, empty past `count`) into slot kt % DEPTH of a ring of
// STRIDE pieces a slot at shared address ring (generic pointer ring_g), and reads it back
// after its group wait.
template <int DEPTH, int STRIDE>
__device__ __forceinline__ void raw_issue(uint32_t ring, int tid, const uint4* src, int kt,
                                          int count) {
  if (kt < count)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ring + ((kt % DEPTH) * STRIDE + tid) * 16),
                 "l"(src + (int64_t)kt * 32));
  cp_async_commit();
}
template <int DEPTH, int STRIDE>
__device__ __forceinline__ uint4 raw_piece(const uint8_t* ring_g, int tid, int kt, int count) {
  return kt < count ? *reinterpret_cast<const uint4*>(ring_g + ((kt % DEPTH) * STRIDE + tid) * 16)
                    : make_uint4(0, 0, 0, 0);
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

// load_x16 at a lane's own pointer (row and k already applied), only where `pred`; else `out`
// keeps what it held. (Written as a C++ branch, the compiler wrapped it in divergent-branch
// bookkeeping each step.)
__device__ __forceinline__ void load_x16p(uint32_t (&out)[8], const uint4* p, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %8, 0;\n"
      " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%9];\n"
      " @p ld.global.nc.v4.u32 {%4, %5, %6, %7}, [%9 + 16];\n}"
      : "+r"(out[0]), "+r"(out[1]), "+r"(out[2]), "+r"(out[3]), "+r"(out[4]), "+r"(out[5]),
        "+r"(out[6]), "+r"(out[7])
      : "r"((int)pred), "l"(p));
}

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
// Issues k tile kt of a warp's NT weight tiles into slot `slot` of its cp.async ring (NT x 32
// lanes of uint4 a slot); a kt past the end issues nothing but still commits a group, so the
// group count stays the step count the waits rely on.
template <int NT>
__device__ __forceinline__ void ring_issue(uint4* ring, int slot, const uint4* const (&wt)[NT],
                                           int kt, int kt_count) {
  if (kt < kt_count) {
#pragma unroll
    for (int j = 0; j < NT; ++j) cp_async16(ring + (slot * NT + j) * 32, wt[j] + (int64_t)kt * 32);
  }
  cp_async_commit();
}

// zeroes every float of a register array of any shape
template <typename A> __device__ __forceinline__ void zero(A& a) {
  constexpr int kN = sizeof(A) / sizeof(float);
  float(&f)[kN] = flat<kN>(a);
#pragma unroll
  for (int i = 0; i < kN; ++i) f[i] = 0.f;
}

// One block: 32 output channels x 16*MT rows of x. Its warps split the K tiles round-robin,
// each streaming them through a cp.async ring of S tiles (below), then sum
// their accumulators in a shared-memory tree (shared float atomics compile to CAS loops on
// sm_90: 2x slower end to end in v1). Sizes fit in int (the launcher checks); offsets into
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
#pragma unroll
  for (int a = 0; a < MT; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + a * 16 + h * 8 + g;
      xrow[a][h] = row < m ? reinterpret_cast<const uint4*>(x + (int64_t)row * ldx) : nullptr;
    }
  const bool hi_rows = m0 + 8 < m;  // (used for MT == 1 only; larger MT prescale every row)

  float acc[MT][4][4], corr[MT][4];
  zero(acc);
  zero(corr);

  // Each warp streams its tiles through a private ring of S 512-byte slots in shared memory,
  // S-1 tiles in flight while one is decoded (v4 kept 2 in registers: 18 us at 4096x22016,
  // latency-bound by ncu: 8.6 cycles per issued instruction, DRAM 16 % busy).
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

template <typename T, int MT, int S, bool GROUP, bool HALF = false>
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

// Small batches (M 17-128, channel or tensor scale): fused_gemm_kernel's split of K over the
// warps of a block, but a warp step takes one k tile of NT neighbouring n tiles, so a warp
// loads and pre-scales its x fragments once for NT weight tiles, and the next step's x is in
// flight while this one decodes (PF). fused_gemm_kernel loads x for every n tile (at M = 64 on
// 4096 x 22016, 688 passes over x, 360 MB from L2 a call); halving that gained 9 % there, as
// the mma.sync work is what bounds M >= 64 (bench/NOTES.md, fourth session). (Branch
// next/gemm-smem staged x once a block in a shared-memory ring with warps split over N
// instead: 2-6x slower on the H200, one barrier a k step and too few warps to cover latency.)
template <typename T, int MT, int NT, int S, bool PF>
__global__ void __launch_bounds__(256, 1)
fused_gemm_nt_kernel(const T* __restrict__ x, int64_t ldx, const uint4* __restrict__ w,
                     const float* __restrict__ scale, const T* __restrict__ bias,
                     T* __restrict__ y, int m, int n, int kt_count, int nt_count,
                     bool per_tensor) {
  constexpr int kAcc = MT * NT * 16;  // a lane's accumulators
  // The weight rings [nwarps][S][NT][32 lanes] uint4; after the main loop the same memory
  // holds the tree sum's [nwarps / 2][kAcc][32 lanes] floats.
  extern __shared__ __align__(16) float red[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * 16 * MT, nt0 = blockIdx.y * NT;
  const uint4* xrow[MT][2];
#pragma unroll
  for (int a = 0; a < MT; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + a * 16 + h * 8 + g;
      xrow[a][h] = row < m ? reinterpret_cast<const uint4*>(x + (int64_t)row * ldx) : nullptr;
    }
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
          if (row < m) y[(int64_t)row * n + col] = from_float<T>(acc[a][j][f][e] * s + b);
          if (row + 8 < m)
            y[(int64_t)(row + 8) * n + col] = from_float<T>(acc[a][j][f][2 + e] * s + b);
        }
      }
}

// Blocks of `threads` threads and `smem` dynamic shared bytes that fit an SM of the current
// device, cached in the caller's per-device array (the first call asks the runtime; no launch,
// so it is safe during graph capture); 1 when the runtime cannot say.
template <typename K>
int occupancy_blocks(K kernel, int threads, size_t smem, std::atomic<int> (&cached)[64]) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 1;
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int blocks = 0;
    if (smem > 48 * 1024)
      (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) !=
            cudaSuccess ||
        blocks < 1)
      blocks = 1;
    (void)cudaGetLastError();
    v = blocks;
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

// Warps a block as launch_fused picks them (up to 8, while the grid has fewer than 16 an SM,
// every warp keeps at least S tiles and, for 8, the grid fits one wave); nwarps > 0 overrides
// it (bench/kernel_lab.cu sweeps it).
template <typename T, int MT, int NT, int S, bool PF>
cudaError_t launch_gemm_nt(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                           const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                           bool per_tensor, int num_sms, cudaStream_t stream, int nwarps = 0) {
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
    // 8 warps only where the grid still fits one wave (sixth session, kernel_lab on the H200:
    // 4096 x 6144 at M = 33 / 64 is 288 / 384 blocks at two 8-warp blocks an SM, 19.5 / 19.9 us
    // against 16.8 / 16.9 with 4 warps; 11008 x 4096, 192 / 256 blocks, keeps 8: 25.4 / 25.5
    // against 26.8 / 28.0)
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
      (int)m, (int)n, kt_count, (int)nt_count, per_tensor);
  return cudaGetLastError();
}

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
// step with A = the constant fragment of ones, shared by the NT tiles. (The first version
// summed x in a prologue, row after row: M = 16 ran 36 us on 4096 x 22016.)
// The time is the warps' serial instruction chains (stage ablations, third and tenth
// sessions), so the k loop is kept short: unrolled over the ring slots, pointers stepped
// rather than recomputed, x rows past M never rewritten, and rows g + 8 decoded in place
// (decode_word_a). SASS, sm_90a, one m block: 116 -> 85 instructions a k tile; lab, eleventh
// session, M = 1, us: 4096 x 22016 13.41 -> 11.54, 4096 x 12288 8.72 -> 7.81, 11008 x 4096
// 8.29 -> 7.81, 4096 x 6144 6.97 -> 6.62.
// ABL is for bench/kernel_lab.cu only, which times what each stage costs by leaving it out
// (wrong results): 1 the correction mma, 2 the decode (raw words go to the mma), 4 the
// weight mma (decoded words are folded into one output), 8 the x loads, 16 all but the
// launch, the tree sum and the stores.
// MINB 2 keeps the kernel to 64 registers, so that two 16-warp blocks share an SM
// (launch_decode says where).
template <typename T, int S, int NB, int NT, int ABL = 0, bool XS = false, bool SE = false,
          int MINB = 1>
__global__ void __launch_bounds__(512, MINB)
fused_decode_kernel(const T* __restrict__ x, int64_t ldx, const uint4* __restrict__ w,
                    const float* __restrict__ scale, const T* __restrict__ bias,
                    T* __restrict__ y, int m, int n, int kt_count, int nt_count,
                    bool per_tensor) {
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
  // Loaded a step or two ahead from global instead, x waited behind the weight tiles in the
  // SM's load queue: at M = 1 that wait was 22 % of the warp samples, and loading two steps
  // ahead left it there (bench/NOTES.md, ninth session). A lane copies, and later reads, its
  // own 32 bytes of each of its warp's steps: rows 8 nb + g, k 16 t .. 16 t + 15.
  const int spw = (kt_count + nwarps - 1) / nwarps;
  uint4* const xs = ring - lane + (nwarps - warp) * S * NT * 32 + warp * spw * m * 8 + 2 * t;
  if (XS) {
    for (int i = 0, kt = warp; kt < kt_count; ++i, kt += nwarps)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
        if (xrow[nb]) {
          uint4* d = xs + (i * m + 8 * nb + g) * 8;
          const uint4* src = xrow[nb] + kt * (kTileK / 8) + 2 * t;
          cp_async16(d, src);
          cp_async16(d + 1, src + 1);
        }
  }
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
    if (!XS) load_x16p(xv[0][nb], xp[nb], xrow[nb] && warp < kt_count);
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
          load_x16p(xv[(u + 1) & 1][nb], xp[nb], xrow[nb] && i + 1 < steps);
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
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int hb = 0; hb < 2; ++hb) {
          const int col = (nt0 + j) * kTileN + 16 * hb + g + 8 * (e >> 1);
          if (col >= n) continue;
          const float s = Dec<T>::kUnscale * ((e >> 1) ? kRowHiUnscale : 1.f) *
                          (SE ? se[j][hb][e >> 1] : per_tensor ? scale[0] : scale[col]);
          const float b = bias ? to_float(bias[col]) : 0.f;
          y[(int64_t)row * n + col] = from_float<T>(acc[j][hb][nb][e] * s + b);
        }
    }
}

// Warps a block: the launcher adds warps (up to 16) while the grid has fewer than 12 an SM and
// every warp keeps S tiles to stream; nwarps > 0 overrides it (bench/kernel_lab.cu sweeps it).
// (Lab, M = 1, S = 4: this picks 4 warps on 4096 x 22016, 8 on 4096 x 12288 and 16 on
// 4096 x 4096, each the fastest of 4, 8 and 16 there or within 0.4 us of it.)
// XS: 0 x from global, 2 x staged in shared memory (fused_decode_kernel), 1 staged where the
// block's x is at most 32 KB and the grid at most two blocks an SM. Lab, ninth session (H200,
// us, SE on): staged against not, M = 1: 11008 x 4096 8.41 / 8.76, 4096 x 6144 7.01 / 8.57,
// 4096 x 4096 5.29 / 5.30, but 4096 x 22016 (six blocks an SM) 15.39 / 14.50; M = 4:
// 4096 x 6144 (32 KB) 7.30 / 8.78, 4096 x 12288 (three blocks an SM) 10.40 / 9.08.
template <typename T, int S, int NB, int NT, int ABL = 0, int XS = 0, bool SE = false>
cudaError_t launch_decode(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                          const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                          bool per_tensor, int num_sms, cudaStream_t stream, int nwarps = 0) {
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
  // registers or fewer: with the early scales (SE) the one-m-block kernel uses 66, so they ran
  // in two rounds. Lab, tenth session, M = 5 / 8, us: 4096 x 6144 8.18 / 8.46 -> 6.84 / 7.20,
  // 8192 x 6144 12.2 -> 10.5 (the bound on every instance cost the others about 1 %, so
  // only these grids take it; bounded, the two-m-block kernels spill).
  const bool two = NB == 1 && nwarps == 16 && blocks > num_sms;
  auto kernel = xs    ? fused_decode_kernel<T, S, NB, NT, ABL, XS != 0, SE>
                : two ? fused_decode_kernel<T, S, NB, NT, ABL, false, SE, NB == 1 ? 2 : 1>
                      : fused_decode_kernel<T, S, NB, NT, ABL, false, SE>;
  const size_t bytes = smem + (xs ? xs_bytes : 0);
  if (bytes > 227 * 1024) return cudaErrorInvalidValue;  // (forced staging, lab only)
  if (bytes > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return e;
  }
  kernel<<<(unsigned)blocks, nwarps * 32, bytes, stream>>>(
      (const T*)x, ldx, reinterpret_cast<const uint4*>(repacked), scale, (const T*)bias, (T*)y,
      (int)m, (int)n, kt_count, (int)nt_count, per_tensor);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// M 65-128 on Hopper (sm_90a): wgmma with the weights as the A operand, decoded straight into
// registers, and x as B from shared memory (bench/NOTES.md, fifth session). The mma.sync
// kernels above spend their time on matrix work at these M; wgmma has 2x the rate, and with A
// in registers the decode writes no shared memory.
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
// The body compiles only for sm_90a; wgmma_rs_compiled() tells the host whether the loaded
// image has it.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // (helpers of the sm_90a body only)
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
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
// each wgmma, the descriptors were 24 of the 148 instructions a warp ran per k tile at 64
// tokens; ncu, ninth session.)
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
// indexed shuffle from lane s ^ (t & 2). (Before: four prmt rounds, each tailored to its
// receiver, and three selects a step to find it.)
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
// to tokens and channels). Written element by element at their (token, channel) places instead, the parts
// took 18.6 % of the warp samples at M = 64 with K split 4 (ncu, ninth session).
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
    sc[hi] = ch0 + 8 * hi < n ? scale[per_tensor ? 0 : ch0 + 8 * hi] * (hi ? hi_mul : 1.f)
                              : 0.f;
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
// rolled loop. (wg_finish's per-element stores were 2866 SASS instructions run once a warp:
// 40 % of the warp samples under ncu, nearly all stall_no_inst.) stmatrix .trans turns each
// 8 x 8 fragment (channels x tokens) into 8 token rows of 8 channels. Each warpgroup's 64
// channels are a [BNX tokens][128 bytes] tile of their own at shared address shalf (generic
// ghalf), one x stage's size, so the persistent wgmma_big can put them in the two stages it
// still holds; 16-byte chunk c of a row sits at c ^ (token % 8), so the 8 rows of one
// stmatrix fall in different banks. The shared memory it overwrites must first be done with
// by both warpgroups' wgmma. wait_raw: first wait for this thread's cp.async groups (those
// kernels whose rings the tile overlaps, or that end here).
template <typename T, int BNX>
__device__ __forceinline__ void wg_store_tile(float (&d)[BNX / 2], uint32_t (&a)[2][4][4],
                                              int wg, int warp, int lane, int m0, int cb0,
                                              int m, int n, const float* scale, bool per_tensor,
                                              const T* bias, uint32_t shalf, const uint8_t* ghalf,
                                              T* y, float hi_mul = 1.f, bool wait_raw = true) {
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
#pragma unroll
  for (int jj = 0; jj < BNX / 16; ++jj) {
    uint32_t r[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int j = 2 * jj + (p >> 1), hi = p & 1;
      r[p] = pack2<T>(d[4 * j + 2 * hi] * sc[hi] + b[hi], d[4 * j + 2 * hi + 1] * sc[hi] + b[hi]);
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

// M > 128 on Hopper (sm_90a), where the grid has at least half a wave of blocks: the decode and
// wgmma of fused_wgmma_rs2_kernel (weights as A from registers, x as B from shared memory)
// with 256 tokens a block, so one decoded A fragment feeds m64n256k16, 4x the tensor work of
// the M <= 128 kernel's m64n64 (bench/NOTES.md, seventh session). Warp-specialized, no block
// barrier in the loop:
// - warpgroup 2, one thread: moves each 64-wide k tile of x by TMA into an S-stage ring (the
//   copy engine writes the 128-byte swizzle wgmma reads); the "full" mbarrier counts bytes,
//   rows past m arrive as zeros.
// - warpgroups 0 and 1, 64 channels each: wait for a stage, issue the wgmma, release the
//   stage they finished with ("empty", after wgmma(kt - 1) retired), decode the next A.
// x arrives in its own k order here, so the A fragment must too: lane (g, t) needs, for k16
// step s, words t / 2 and 2 + t / 2 of lane (g, s)'s 16 bytes (the tile layout above holds
// physical k = 16 t + 4 s' + 2 u' + h in word s' of lane t). Each lane cp.asyncs its own 16
// bytes (8-deep ring), packs the bytes of this warp's channels into two words (one prmt each),
// and a k16 step takes its word by one indexed shuffle within the quad (5 a k tile; decode).
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
                       int row_blocks, int tiles, const __grid_constant__ CUtensorMap xmap) {
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
                              base + wg * kX, sbase + wg * kX, y, kBigHiUnscale);
      else
        wg_store_part<BNX>(d, a, tid, cb0 + wg * 64 + 16 * warp + g, n, scale, per_tensor,
                           ws + ((int64_t)blockIdx.z * gridDim.x + blockIdx.x) * BNX * 128,
                           kBigHiUnscale);
    } else {
      // release the pad stages now (the producer's way into the next tile), fetch the next
      // tile's first weight pieces (into slots this tile's reads are done with), store the
      // output through the two held stages, then release those. A pad stage is released only
      // once its "full" phase completed, i.e. once the producer has passed its empty wait:
      // released earlier, that stage's barrier could complete two phases before the producer
      // polls it, and the parity it waits for would then never come (3 hangs in about
      // 31,000 launches at M = 16384, K = 5504: ternary.kernel_soak, twenty-second session).
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
                            base + mine * kX, sbase + mine * kX, y, kBigHiUnscale, false);
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
// 64 wg + 16 warp + g + (0, 8).
template <typename T, int BNX>
__global__ void wgmma_big_finish_kernel(const float* __restrict__ ws, const T* __restrict__ bias,
                                        T* __restrict__ y, int m, int n, int tile0,
                                        int row_blocks, int tiles, int splits) {
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
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = row0 + e;
      if (row < m) y[(int64_t)row * n + col] = from_float<T>(vals[2 * hi + e] + bc);
    }
  }
}

// cuTensorMapEncodeTiled through the runtime (no link to libcuda), looked up once
using TensorMapEncode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                     const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                     const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
TensorMapEncode tensor_map_encoder() {
  static std::atomic<TensorMapEncode> fn{nullptr};
  TensorMapEncode f = fn.load(std::memory_order_acquire);
  if (f == nullptr) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                           cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
      (void)cudaGetLastError();
      return nullptr;
    }
    f = reinterpret_cast<TensorMapEncode>(p);
    fn.store(f, std::memory_order_release);
  }
  return f;
}

// x [m, k] (row stride ldx elements) in boxes of 64 k x `rows` rows, 128-byte swizzled; rows
// past m read as zeros
template <typename T>
bool x_tensor_map(CUtensorMap* map, const void* x, int64_t ldx, int64_t m, int64_t k, int rows) {
  const TensorMapEncode encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)m};
  const cuuint64_t strides[1] = {(cuuint64_t)ldx * sizeof(T)};
  const cuuint32_t box[2] = {(cuuint32_t)kTileK, (cuuint32_t)rows}, step[2] = {1, 1};
  return encode(map, std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                     : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2, const_cast<void*>(x), dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

constexpr int kBigRows = 256, kBigStages = 6;  // the route's tile and ring (lab, seventh session)
constexpr int kBigMinM = 32;  // M above this on Hopper may take wgmma_big (pick_route)

// The fp32 floats launch_wgmma_big's split parts take: `splits` parts of `split_tiles` tiles
int64_t wgmma_big_workspace_floats(int splits, int64_t split_tiles, int bnx) {
  return splits > 1 ? splits * split_tiles * bnx * 128 : 0;
}

// fused_wgmma_big_kernel's dynamic shared memory: the x ring, the weight ring, the barriers and
// the slack for its 1024-byte alignment
template <int BNX, int S> constexpr int wgmma_big_smem() {
  return S * BNX * kTileK * 2 + 8 * kBigConsumers * 16 + 2 * S * 8 + 1024;
}

// Whether a wgmma_big launch of `count` tiles of bnx tokens, K split z ways over k_tiles k
// tiles, runs the persistent kernel (one block an SM over the tiles): 256-token tiles past a
// wave, unsplit. The persistent kernel keeps two stages of a tile for its output, so it needs
// two k tiles. TERNARY_PERSISTENT=0 turns it off.
bool wgmma_big_persistent(int bnx, int z, int64_t count, int sms, int64_t k_tiles) {
  return bnx == kBigRows && z == 1 && count > sms && k_tiles >= 2 && persistent_allowed();
}

// tail 0: every tile split `splits` ways (1: none). tail > 0: the first tiles unsplit, then
// the last `tail` tiles (the partial wave) split `splits` ways in a second launch.
template <typename T, int BNX, int S, int ABL = 0>
cudaError_t launch_wgmma_big(const void* x, int64_t ldx, const uint8_t* repacked,
                             const float* scale, const void* bias, void* y, int64_t m, int64_t n,
                             int64_t k, bool per_tensor, int splits, int64_t tail, float* ws,
                             int num_sms, cudaStream_t stream) {
  if (m > INT32_MAX - 512 || n > INT32_MAX - 512 || k > INT32_MAX - 64) return cudaErrorInvalidValue;
  // TMA: a 16-byte aligned base and row stride
  if (k % kTileK || ldx % 8 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  if (splits < 1 || splits > 64 || (splits > 1 && ws == nullptr)) return cudaErrorInvalidValue;
  constexpr int kSmem = wgmma_big_smem<BNX, S>();
  auto kernel = fused_wgmma_big_kernel<T, BNX, S, false, ABL>;
  // persistent only with 256-token tiles (lab, fourteenth session, us, one tile a block ->
  // persistent, two runs each: 4096 x 4096 M=4096 186.8 / 189.7 -> 180.0 / 179.9, 4096 x 22016
  // M=4096 1092.4 / 1093.5 -> 1083.1 / 1079.2, 4096 x 12288 M=1024 130.5 / 135.5 -> 129.2 /
  // 129.3; with 128-token tiles it lost: 4096 x 22016 M=256 69.9 / 69.8 -> 73.0 / 73.2,
  // 4096 x 6144 M=1024 70.8 / 71.2 -> 72.9 / 72.9)
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
  // The call's first launch is plain (the kernel before it, another op's, triggers nothing,
  // so it gains nothing from early launch); the launches that follow it within this call (the
  // split tail after the whole tiles, the finish kernel after its split parts) are
  // programmatic dependents (pdl_wait). Lab, sixteenth session, M = 64 after a plain copy
  // kernel, us: 4096 x 22016 (tail split) 36.37 -> 33.73, 11008 x 4096 (split) 19.36 -> 17.61,
  // 4096 x 6144 16.24 -> 14.72, 4096 x 4096 12.25 -> 10.75.
  auto run = [&](int64_t tile0, int64_t count, int z, bool follows) {
    const bool p = wgmma_big_persistent(BNX, z, count, sms, k / kTileK);
    const dim3 grid((unsigned)(p ? sms : count), 1, (unsigned)z);
    cudaError_t e = launch_k(p ? persistent : kernel, grid, dim3(384), kSmem, stream, follows,
                             reinterpret_cast<const uint4*>(repacked), scale, (const T*)bias,
                             (T*)y, z > 1 ? ws : nullptr, (int)m, (int)n, (int)(k / kTileK),
                             (int)((n + kTileN - 1) / kTileN), per_tensor, (int)tile0, (int)mb,
                             (int)count, xmap);
    if (e == cudaSuccess && z > 1) {
      const int64_t total = count * BNX * 128 / 4;  // a thread a float4
      e = launch_k(wgmma_big_finish_kernel<T, BNX>, dim3((unsigned)((total + 255) / 256)),
                   dim3(256), 0, stream, true, ws, (const T*)bias, (T*)y, (int)m, (int)n,
                   (int)tile0, (int)mb, (int)count, z);
    }
    return e;
  };
  cudaError_t e = cudaSuccess;
  if (tail > 0 && splits > 1) {
    if (tiles > tail) e = run(0, tiles - tail, 1, false);
    if (e == cudaSuccess) e = run(tiles - tail, tail, splits, tiles > tail);
  } else {
    e = run(0, tiles, splits, false);
  }
  return e;
}

// Its shared array exists only in the sm_90a image, so cudaFuncGetAttributes (no launch, no
// sync: safe while a graph is captured) tells which image the device loaded.
__global__ void wgmma_rs_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int mark[256];
  mark[threadIdx.x] = (int)threadIdx.x;
  __syncthreads();
  if (out) *out = mark[255 - threadIdx.x];
#endif
}

bool wgmma_rs_compiled() {
  static std::atomic<int> state[64];  // per device: 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int v = state[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    cudaFuncAttributes a{};
    const bool yes = cudaFuncGetAttributes(&a, wgmma_rs_probe_kernel) == cudaSuccess &&
                     a.sharedSizeBytes >= 1024;
    (void)cudaGetLastError();
    v = yes ? 2 : 1;
    state[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

// The route's choice (bench/NOTES.md, fifth session, kernel_lab on the H200): 128 tokens with
// K split until the grid is about one wave (11008 x 4096: 36.3 against 47.3 us at M = 128).
// Below M = 97 it pays only where K is split (a 128-token block without a split is one long
// chain). Since the ninth session pick_route gives it only grids that wgmma_big cannot make
// half a wave of; the channel blocks alone never fill the GPU here.
struct WgmmaRsPlan {
  int bnx = 0;  // 0: not this route
  int splits = 1;
  int64_t tail = 0;  // wgmma_big: split only the last `tail` tiles (its partial wave)
};
WgmmaRsPlan wgmma_rs_plan(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms) {
  WgmmaRsPlan p;
  if (group_size != 0 || m < 65 || m > 128 || k < kTileK || !wgmma_rs_compiled()) return p;
  const int64_t nb = (n + 127) / 128, kt = k / kTileK;
  if (nb >= num_sms) return p;  // (wgmma_big's)
  int s = 1;
  while (s < 4 && nb * s * 2 <= num_sms && kt >= s * 2) s *= 2;
  if (m >= 97 || s >= 2) {
    p.bnx = 128;
    p.splits = s;
  }
  return p;
}

// The one place that decides which kernel gemm_fused runs for a shape: launch_fused_typed
// launches it, gemm_fused_route names it and gemm_fused_workspace_floats sizes its workspace.
// The measurements behind each rule are in launch_fused_typed.
enum class FusedKernel {
  kGroupHalf,   // group scales, M <= 8: fused_gemm without the zero half of the A fragments
  kGroup,       // group scales: fused_gemm, one m16 tile a block
  kDecode,      // M <= 8: the decode kernel, one n tile a step
  kDecodePair,  // M <= 8 where that grid has 4 or more blocks an SM: two n tiles a step
  kDecodeShallow,  // M <= 8 where that grid has 0.5-1.5 blocks an SM: 16 warps, a 2-deep ring,
                   // x from global
  kDecodeWide,  // M 9-16 where the grid has more blocks than SMs (outside kDecodeNt2W4's
                // band): two n tiles a step, 4 or 8 warps
  kDecodeNt2,   // M 9-16 where the grid is at most one block an SM: two m tiles, one n tile
  kDecodeNt2W4, // M 9-16 where that grid has 2-3 blocks an SM: the same kernel with 4 warps
  kWgmmaRs,     // Hopper, M 65-128 where wgmma_big's grid is under half a wave (wgmma_rs_plan)
  kWgmmaBig,    // Hopper, M > 32 where its 64/128/256 x 128 tiles make half a wave (TMA x)
  kGemmNt,      // M 17-128 otherwise (and M > 128 elsewhere): one m16 tile, two n tiles a step
};
struct FusedRoute {
  FusedKernel kernel;
  WgmmaRsPlan wg;  // for kWgmmaRs and kWgmmaBig (its splits)
};
FusedRoute pick_route(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms) {
  if (group_size) return {m <= 8 ? FusedKernel::kGroupHalf : FusedKernel::kGroup, {}};
  if (m <= 8) {
    const int64_t tiles = (n + kTileN - 1) / kTileN;
    if (tiles >= 4 * (int64_t)num_sms) return {FusedKernel::kDecodePair, {}};
    if (2 * tiles > num_sms && 2 * tiles <= 3 * (int64_t)num_sms)
      return {FusedKernel::kDecodeShallow, {}};
    return {FusedKernel::kDecode, {}};
  }
  if (m <= 16) {
    const int64_t tiles = (n + kTileN - 1) / kTileN, sms = num_sms;
    if (tiles <= sms) return {FusedKernel::kDecodeNt2, {}};
    // one n tile a block where that grid is 2-3 blocks an SM: two n tiles a step would leave
    // half the SMs a block short in the last round (launch_fused_typed has the numbers)
    if (tiles > 2 * sms && tiles <= 3 * sms) return {FusedKernel::kDecodeNt2W4, {}};
    return {FusedKernel::kDecodeWide, {}};
  }
  if (m > kBigMinM) {
    // lab (seventh session): 4096 x 22016 M=256 (172 blocks) 96 us against the dequantize
    // route's 146, 11008 x 4096 M=1024 (128 blocks) 117 against 159; a block's time hardly
    // depends on the grid below a wave, so 32 blocks (N=4096, M=256) lose (115 against 83):
    // at least half a wave takes it, the dequantize route (ops.cpp) keeps the rest
    // (with K split up to 4 ways to get there, as wgmma_rs_plan does). Past a wave, the tiles
    // of the last, partial wave split 2 or 4 ways where K is long enough to repay the fp32
    // parts. Lab, eighth session (us, unsplit -> tail split 2 / 4): 4096 x 6144 M=1024 (192
    // tiles) 95.8 -> 89.3 / 97.6; 4096 x 22016 M=1024 (688) 295.3 -> 284.7 / 274.8 (both
    // before the shared-memory epilogue). Less than the rounds predict (65 for the first): the
    // second launch and the fp32 sum are not free.
    // M <= 128 takes tiles of 64 or 128 tokens (ninth session, lab at M = 64, us, against
    // fused_gemm_nt): 4096 x 22016 41.0 (tail split 2) / 49.3, 11008 x 4096 20.1 (split 4) /
    // 25.4, 4096 x 4096 11.7 / 13.1, 4096 x 12288 24.0 / 30.9, 4096 x 6144 17.3 / 16.9.
    int bnx = m <= 64 ? 64 : m <= 128 ? 128 : kBigRows;
    if (m > 128 && k <= 8192) {
      // 128-token tiles where the 256-token grid, past a wave, leaves much of its last round
      // idle or pads M by up to half a tile: a 128-token tile costs about 0.6 of a 256-token
      // one, so they win when they need at most 1.5 x the rounds. Lab, thirteenth session, us,
      // 256-token route -> 128 (rounds r256 -> r128): 4096 x 22016 M=256 (2 -> 3) 74.9 -> 70.0,
      // M=384 (3 -> 4) 133.0 -> 94.7; 4096 x 12288 M=384 74.5 -> 59.9, M=512 77.6 -> 70.5;
      // 8192 x 28672 M=384 (4 -> 6) 335 -> 267; 5120 x 13824 M=384 105.0 -> 79.9; 4096 x 6144
      // M=768 61.4 -> 59.9, M=1024 77.3 -> 70.7; 4096 x 4096 M=1536 76.7 -> 71.1; 8192 x 8192
      // M=768 135.5 -> 133.2. K above 8192 keeps 256: 11008 x 4096 M=1536 (2 -> 3) took
      // 177.4 -> 191.3 (its last round's tiles split 2 ways, which long K repays). Not taken:
      // 4096 x 22016 M=1024 (6 -> 11) 249.3 against 282.4 with 128.
      const int64_t nb = (n + 127) / 128, sms = num_sms;
      const int64_t r256 = ((m + 255) / 256 * nb + sms - 1) / sms;
      const int64_t r128 = ((m + 127) / 128 * nb + sms - 1) / sms;
      if (r256 >= 2 && 2 * r128 <= 3 * r256) bnx = 128;
    }
    const int64_t kt = k / kTileK;
    auto split_for = [&](int64_t b) {  // K split up to 4 ways until the grid makes half a wave
      int s = 1;
      while (s < 4 && b * s * 2 < num_sms && kt >= s * 4) s *= 2;
      return s;
    };
    int64_t blocks = (m + bnx - 1) / bnx * ((n + 127) / 128);
    int s = split_for(blocks);
    if (bnx == kBigRows && s > 1 && 2 * blocks * s >= num_sms) {
      // under half a wave, 128-token tiles rather than a K split of 256-token ones (which
      // still decides whether this route runs at all). Lab, thirteenth session, us, 256 split
      // -> 128: 4096 x 6144 M=256 30.97 (split 2) -> 23.89 (unsplit), 4096 x 4096 M=256
      // 21.40 (4) -> 19.41 (2), 11008 x 4096 M=256 37.87 (4) -> 36.49 (2), 4096 x 4096 M=512
      // 32.93 (2) -> 24.49 (1), 11008 x 4096 M=512 65.88 (2) -> 58.82 (1). Unsplit 256-token
      // grids stay ahead: 4096 x 12288 M=256 43.10 against 46.68.
      bnx = 128;
      blocks = (m + bnx - 1) / bnx * ((n + 127) / 128);
      s = split_for(blocks);
    }
    // Grids past a wave at M 33-48 kept fused_gemm_nt until the twelfth session; with the
    // shorter wgmma_big loop (rows g + 8 in place) this route wins there too. Lab, M = 33 /
    // 48, us, fused_gemm_nt -> this route: 4096 x 22016 (tail split 2) 36.97 / 37.50 ->
    // 35.34 / 34.80, 8192 x 28672 (unsplit) 89.28 / 90.41 -> 79.82 / 71.51, 4096 x 28672
    // 49.43 / 50.23 -> 41.76 / 38.82, 5120 x 27648 55.27 / 56.05 -> 49.70 / 46.95,
    // 8192 x 22016 67.18 / 68.16 -> 63.12 / 59.55.
    if (2 * blocks * s >= num_sms && k >= kTileK && wgmma_rs_compiled() &&
        tensor_map_encoder() != nullptr) {
      WgmmaRsPlan p{bnx, s, 0};
      const int64_t rest = blocks % num_sms;
      if (blocks > num_sms && rest > 0 && kt >= 32) {
        int ts = 1;
        while (ts < 4 && rest * ts * 2 <= num_sms) ts *= 2;
        if (ts > 1) p = {bnx, ts, rest};
      }
      return {FusedKernel::kWgmmaBig, p};
    }
    if (m > 128) return {FusedKernel::kGemmNt, {}};
  }
  const WgmmaRsPlan plan = wgmma_rs_plan(m, n, k, group_size, num_sms);
  if (plan.bnx) return {FusedKernel::kWgmmaRs, plan};
  return {FusedKernel::kGemmNt, {}};
}

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

template <typename T>
cudaError_t launch_fused_typed(const void* x, int64_t ldx, const uint8_t* repacked,
                               const float* scale, const void* bias, void* y, int64_t m,
                               int64_t n, int64_t k, int64_t group_size, bool per_tensor,
                               int num_sms, float* workspace, cudaStream_t stream) {
  // x rows arrive padded to whole tiles (ops.cpp), so k here is a multiple of 64.
  FusedRoute r = pick_route(m, n, k, group_size, num_sms);
  // a split without its workspace (a caller that passed none) takes fused_gemm_nt
  if ((r.kernel == FusedKernel::kWgmmaRs || r.kernel == FusedKernel::kWgmmaBig) &&
      r.wg.splits > 1 && workspace == nullptr)
    r.kernel = FusedKernel::kGemmNt;
  switch (r.kernel) {
    // group scales: one m16 tile per block, the per-tile group partials need the registers
    case FusedKernel::kGroupHalf:
      return launch_fused<T, 1, 8, true, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                               group_size, per_tensor, num_sms, stream);
    case FusedKernel::kGroup:
      return launch_fused<T, 1, 8, true>(x, ldx, repacked, scale, bias, y, m, n, k, group_size,
                                         per_tensor, num_sms, stream);
    // bench/kernel_lab.cu on the H200 (bench/NOTES.md): the decode kernel with one n tile a
    // step wins at M <= 8 on every shape, with a 4-tile ring (fourth session: 14.2 against
    // 14.5 us on 4096 x 22016, 5.5 against 5.8 on 4096 x 4096). At M <= 16 it wins where the
    // grid is one block an SM (11008 x 4096: 12.3 us against 17.7) and, with two n tiles a
    // step and 4 warps, where it has 4 or more (4096 x 22016: 18.4 against 21.8). A 4-tile
    // ring beats 8 at M = 16 too (fourth session: 17.4 against 18.3 us on 4096 x 22016, 11.3
    // against 12.2 on 11008 x 4096).
    // Ninth session (lab, us, old route -> this one, same call): the scales loaded early (SE)
    // and x staged where it fits (XS), M = 1 / 4: 4096 x 22016 13.78 / 14.02 -> 13.31 / 13.47,
    // 11008 x 4096 8.89 / 9.07 -> 8.18 / 8.61, 4096 x 6144 7.47 / 7.70 -> 6.87 / 7.19,
    // 4096 x 4096 5.50 / 5.68 -> 5.15 / 5.29 (4096 x 6144 at M = 8, not staged: 7.77 ->
    // 8.41). With SE the two-n-tile kernel also beats fused_gemm_kernel between one and four
    // blocks an SM, M = 16: 4096 x 6144 9.51 against 10.03, 4096 x 12288 12.03 against 13.65;
    // SE at M = 16: 11008 x 4096 10.60 against 11.33, 4096 x 22016 16.13 against 17.44.
    case FusedKernel::kDecode:
      return launch_decode<T, 4, 1, 1, 0, 1, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream);
    // Eleventh session, lab, M = 1 / 8, us, one n tile a step -> two (4 warps), grids of 4 or
    // more blocks an SM: 4096 x 22016 11.46 / 11.72 -> 10.69 / 10.87, 8192 x 22016 20.10 /
    // 20.84 -> 17.92 / 19.23, 4096 x 28672 13.28 / 13.59 -> 13.04 / 13.21, 8192 x 28672
    // 22.90 / 23.66 -> 22.28 / 22.45, 5120 x 27648 15.49 / 15.94 -> 15.41 / 15.58. Below that
    // it loses: 4096 x 12288 (three blocks an SM) 7.78 -> 9.09 at M = 1.
    case FusedKernel::kDecodePair:
      return launch_decode<T, 4, 1, 2, 0, 1, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream, 4);
    // Seventeenth session, lab, M = 1 / 4 / 8, us, after a plain kernel that writes x, two runs
    // in reversed order (second shown): kDecode -> this (16 warps, 2-deep ring, x not staged):
    // 4096 x 4096 (128 blocks) 6.53 / 6.72 / 6.74 -> 6.23 / 6.39 / 6.43, 4096 x 6144 (192)
    // 7.96 / 8.20 / 8.59 -> 7.44 / 7.65 / 7.75, 5120 x 5120 (160) 8.82 / 9.10 / 9.23 -> 8.20 /
    // 8.39 / 8.50, 8192 x 6144 (192) 10.94 / 11.17 / 11.39 -> 10.40 / 10.61 / 10.75, 11008 x
    // 4096 (128) 9.29 / 9.31 / 9.51 -> 9.11 / 9.38 / 9.55. Outside the band it loses or ties:
    // 4096 x 12288 (384 blocks) 9.21 -> 10.29 at M = 1, 4096 x 1024 (32) 5.52 -> 5.26 in one
    // run and 5.18 -> 5.26 in the other. (Staging x, the same ring loses 0.3-1.1 us at M = 1.)
    case FusedKernel::kDecodeShallow:
      return launch_decode<T, 2, 1, 1, 0, 0, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream, 16);
    case FusedKernel::kDecodeWide: {
      // 8 warps where the grid is at most one block an SM (at 126 registers only two 8-warp
      // blocks fit an SM). Lab, eleventh session, M = 12 / 16, us, 4 warps -> 8: 4096 x 6144
      // 10.79 / 10.84 -> 7.75 / 7.77, 8192 x 6144 18.27 / 18.38 -> 11.89 / 11.95; with more
      // blocks 8 loses (4096 x 22016: 14.72 / 15.24 -> 15.67 / 16.23), except at 3-4 tiles an
      // SM (this route's grid at most two 8-warp blocks an SM). Thirteenth session, M = 16,
      // 4 warps -> 8: 4096 x 14336 (448 tiles) 11.65 -> 11.30, 5120 x 13824 (432) 13.58 ->
      // 13.15, 8192 x 14336 (448) 19.47 -> 18.32, 14336 x 14336 (448) 34.36 -> 28.93; 8192 x
      // 28672 (896) 33.96 -> 33.61 stays at 4 with 4096 x 22016 (688). Between 448 and 688
      // tiles unmeasured.
      const int64_t tiles = (n + kTileN - 1) / kTileN, blocks = (tiles + 1) / 2;
      return launch_decode<T, 4, 2, 2, 0, 0, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream,
                                                   blocks <= num_sms || tiles <= 4 * num_sms
                                                       ? 8 : 4);
    }
    case FusedKernel::kDecodeNt2:
      return launch_decode<T, 4, 2, 1, 0, 0, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream);
    // Twelfth session, lab, M = 12 / 16, us, kDecodeWide -> this: 4096 x 12288 (384 tiles)
    // 11.39 / 11.51 -> 10.30 / 10.36, 8192 x 12288 19.14 / 19.32 -> 17.32 / 17.40. With
    // two n tiles a step those grids are 192 blocks: 60 SMs take two, 72 one. Outside the
    // band it loses: 5120 x 13824 (432 tiles) 13.16 / 13.26 -> 15.48 / 15.79, 8192 x 28672
    // (896) 33.54 / 34.03 -> 37.65 / 37.88.
    case FusedKernel::kDecodeNt2W4:
      return launch_decode<T, 4, 2, 1, 0, 0, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream, 4);
    case FusedKernel::kWgmmaRs:
      return launch_wgmma_rs<T, 128>(x, ldx, repacked, scale, bias, y, m, n, k, per_tensor,
                                     r.wg.splits, workspace, stream);
    case FusedKernel::kWgmmaBig:  // (8 stages at 64 and 128 tokens: lab, ninth session)
      if (r.wg.bnx == 64)
        return launch_wgmma_big<T, 64, 8>(x, ldx, repacked, scale, bias, y, m, n, k, per_tensor,
                                          r.wg.splits, r.wg.tail, workspace, num_sms, stream);
      if (r.wg.bnx == 128)
        return launch_wgmma_big<T, 128, 8>(x, ldx, repacked, scale, bias, y, m, n, k, per_tensor,
                                           r.wg.splits, r.wg.tail, workspace, num_sms, stream);
      return launch_wgmma_big<T, kBigRows, kBigStages>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                       per_tensor, r.wg.splits, r.wg.tail,
                                                       workspace, num_sms, stream);
    case FusedKernel::kGemmNt:
      break;
  }
  // M 17-128: one m16 tile and two n tiles a warp step (fourth session, lab: on 4096 x 22016
  // 29.8 / 49.3 / 87.8 us at M = 32 / 64 / 128 against fused_gemm_kernel MT=2's
  // 35.9 / 53.8 / 104.4; best or within 10 % of the best of 13 variants on all five shapes up
  // to M = 64). Above M = 128 ternary/kernels.py routes to dequantize + cuBLAS.
  return launch_gemm_nt<T, 1, 2, 4, true>(x, ldx, repacked, scale, bias, y, m, n, k, per_tensor,
                                          num_sms, stream);
}

// The inverse of repack_kernel: one canonical byte (four codes along K) per iteration,
// gathered from the tile positions repack_kernel put them at. The large-M route of the fused
// kernel dequantizes from here, so a layer keeps only the repacked weight in memory.
__global__ void unrepack_kernel(const uint8_t* __restrict__ repacked, uint8_t* __restrict__ out,
                                int64_t n, int64_t k, int64_t kt_count) {
  const int64_t kb = k / 4, total = n * kb;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t nn = i / kb, k0 = (i % kb) * 4;
    const int64_t nt = nn / kTileN;
    const int f = (int)(nn % kTileN) / 8, g = (int)(nn % 8);
    unsigned v = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t kk = k0 + j;
      const int64_t kt = kk / kTileK;
      const int kr = (int)(kk % kTileK);
      const int t = kr / 16, w = (kr % 16) / 4, rr = (kr % 4) / 2, h = kr % 2;
      const int lane = g * 4 + t, byte = (w << 2) | (h << 1) | (f >> 1), slot = (f & 1) * 2 + rr;
      const uint8_t b = repacked[(nt * kt_count + kt) * kTileBytes + lane * 16 + byte];
      v |= ((b >> (2 * slot)) & 3u) << (2 * j);
    }
    out[i] = (uint8_t)v;
  }
}

// The large-M route's dequantize, read from the tiles themselves (a layer then keeps no
// canonical copy). A thread writes 16 consecutive elements of one row, and consecutive threads
// consecutive 16-element segments of that row, so a warp's stores are one contiguous run as
// in the canonical dequantize. The 16 codes of row n = 32 nt + 8 f + g at k = 64 kt + 16 t +
// [0, 16) are in lane (g, t)'s 16 bytes of tile (nt, kt) (the layout above); the four f of a
// lane share those bytes, so a tile is read from DRAM once and from L2 up to four times.
// (v1 gave a warp one tile, each lane writing 8 rows' worth of 32-byte pieces: 196 us on
// 4096 x 22016 against 70 for the canonical dequantize.) The arithmetic per element is
// dequantize_vec_kernel's (pack.cu): the same bits.
template <typename T>
__global__ void dequantize_repacked_kernel(const uint4* __restrict__ tiles,
                                           const float* __restrict__ scale, T* __restrict__ out,
                                           int64_t n, int64_t k, int64_t kt_count,
                                           int64_t group_size, bool per_tensor, bool vec) {
  const int64_t segs = (k + 15) / 16, items = n * segs;
  const int64_t groups = group_size ? (k + group_size - 1) / group_size : 1;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < items;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / segs, k0 = (i % segs) * 16;
    const int64_t nt = row / kTileN, kt = k0 / kTileK;
    const int f = (int)(row % kTileN) / 8, g = (int)(row % 8), t = (int)(k0 % kTileK) / 16;
    const uint4 q = __ldg(tiles + (nt * kt_count + kt) * 32 + g * 4 + t);
    const uint32_t word[4] = {q.x, q.y, q.z, q.w};
    const float s = per_tensor ? __ldg(scale)
                    : group_size ? __ldg(scale + row * groups + k0 / group_size)
                                 : __ldg(scale + row);
    union {
      T e[16];
      uint4 v[sizeof(T)];
    } u;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned code = (word[w] >> (16 * h + 2 * (2 * f + r))) & 3u;
          u.e[4 * w + 2 * r + h] = from_float<T>((float)((int)code - 1) * s);
        }
      }
    }
    T* dst = out + row * k + k0;
    if (vec && k0 + 16 <= k) {
      uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
      for (int v = 0; v < (int)sizeof(T); ++v) d[v] = u.v[v];
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {  // unrolled: constant indices keep u in registers
        if (k0 + j < k) dst[j] = u.e[j];
      }
    }
  }
}

}  // namespace fused_cu

cudaError_t launch_dequantize_repacked(const uint8_t* repacked, const float* scale, void* out,
                                       DType dtype, int64_t n, int64_t k, int64_t group_size,
                                       bool per_tensor, cudaStream_t stream) {
  if (n == 0 || k == 0) return cudaSuccess;
  if (group_size % kTileK || reinterpret_cast<uintptr_t>(repacked) % 16) return cudaErrorInvalidValue;
  const int64_t kt_count = (k + kTileK - 1) / kTileK;
  const int64_t items = n * ((k + 15) / 16);
  constexpr int kThreads = 256;
  int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  const uint4* tiles = reinterpret_cast<const uint4*>(repacked);
  const size_t esize = dtype == DType::kFloat ? 4 : 2;
  const bool vec = (k * esize) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  switch (dtype) {
    case DType::kHalf:
      dequantize_repacked_kernel<__half><<<(unsigned)blocks, kThreads, 0, stream>>>(
          tiles, scale, (__half*)out, n, k, kt_count, group_size, per_tensor, vec);
      break;
    case DType::kBFloat16:
      dequantize_repacked_kernel<__nv_bfloat16><<<(unsigned)blocks, kThreads, 0, stream>>>(
          tiles, scale, (__nv_bfloat16*)out, n, k, kt_count, group_size, per_tensor, vec);
      break;
    case DType::kFloat:
      dequantize_repacked_kernel<float><<<(unsigned)blocks, kThreads, 0, stream>>>(
          tiles, scale, (float*)out, n, k, kt_count, group_size, per_tensor, vec);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_unrepack(const uint8_t* repacked, uint8_t* out, int64_t n, int64_t k,
                            cudaStream_t stream) {
  const int64_t total = n * (k / 4);
  if (total == 0) return cudaSuccess;
  int64_t blocks = (total + 255) / 256;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  unrepack_kernel<<<(unsigned)blocks, 256, 0, stream>>>(repacked, out, n, k,
                                                        (k + kTileK - 1) / kTileK);
  return cudaGetLastError();
}

cudaError_t launch_repack(const uint8_t* packed, uint8_t* out, int64_t n, int64_t k,
                          cudaStream_t stream) {
  const int64_t kt_count = (k + kTileK - 1) / kTileK;
  const int64_t total = ((n + kTileN - 1) / kTileN) * kt_count * kTileBytes;
  if (total == 0) return cudaSuccess;
  int64_t blocks = (total + 255) / 256;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  repack_kernel<<<(unsigned)blocks, 256, 0, stream>>>(packed, out, n, k, kt_count, total);
  return cudaGetLastError();
}

int64_t gemm_fused_workspace_floats(int64_t m, int64_t n, int64_t k, int64_t group_size,
                                    int num_sms) {
  if (m == 0 || n == 0) return 0;
  const FusedRoute r = pick_route(m, n, k, group_size, num_sms);
  if (r.kernel == FusedKernel::kWgmmaBig) {
    const int64_t tiles = (m + r.wg.bnx - 1) / r.wg.bnx * ((n + 127) / 128);
    return wgmma_big_workspace_floats(r.wg.splits, r.wg.tail ? r.wg.tail : tiles, r.wg.bnx);
  }
  return r.kernel == FusedKernel::kWgmmaRs && r.wg.splits > 1 ? r.wg.splits * m * n : 0;
}

const char* gemm_fused_route(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms) {
  const FusedRoute r = pick_route(m, n, k, group_size, num_sms);
  switch (r.kernel) {
    case FusedKernel::kGroupHalf: return "fused_gemm_half";
    case FusedKernel::kGroup: return "fused_gemm";
    // the decode kernel's instances (launch_fused_typed), each named so a test can tell which
    // one a shape takes; all begin with "decode"
    case FusedKernel::kDecode: return "decode";
    case FusedKernel::kDecodePair: return "decode_pair";
    case FusedKernel::kDecodeShallow: return "decode_shallow";
    case FusedKernel::kDecodeWide: return "decode_wide";
    case FusedKernel::kDecodeNt2: return "decode_nt2";
    case FusedKernel::kDecodeNt2W4: return "decode_nt2_w4";
    case FusedKernel::kWgmmaRs: return r.wg.splits > 1 ? "wgmma_rs_splitk" : "wgmma_rs";
    case FusedKernel::kWgmmaBig:
      return r.wg.splits == 1 ? "wgmma_big" : r.wg.tail ? "wgmma_big_tail" : "wgmma_big_splitk";
    case FusedKernel::kGemmNt: break;
  }
  return "fused_gemm_nt";
}

void gemm_fused_plan(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms,
                     int* tokens, int* splits, bool* persistent) {
  const FusedRoute r = pick_route(m, n, k, group_size, num_sms);
  const bool wg = r.kernel == FusedKernel::kWgmmaRs || r.kernel == FusedKernel::kWgmmaBig;
  *tokens = wg ? r.wg.bnx : 0;
  *splits = wg ? r.wg.splits : 1;
  *persistent = false;
  if (r.kernel == FusedKernel::kWgmmaBig) {  // launch_wgmma_big's first (or only) launch
    const int64_t tiles = (m + r.wg.bnx - 1) / r.wg.bnx * ((n + 127) / 128);
    const bool tail = r.wg.tail > 0 && r.wg.splits > 1;
    *persistent = wgmma_big_persistent(r.wg.bnx, tail ? 1 : r.wg.splits,
                                       tail ? tiles - r.wg.tail : tiles, num_sms, k / kTileK);
  }
}

bool gemm_fused_takes_large_m(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms) {
  return m > 128 && pick_route(m, n, k, group_size, num_sms).kernel == FusedKernel::kWgmmaBig;
}

cudaError_t launch_gemm_fused(const void* x, int64_t ldx, const uint8_t* repacked,
                              const float* scale, const void* bias, void* y, DType dtype,
                              int64_t m, int64_t n, int64_t k, int64_t group_size,
                              bool per_tensor, int num_sms, float* workspace,
                              cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (group_size % kTileK) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kHalf:
      return launch_fused_typed<__half>(x, ldx, repacked, scale, bias, y, m, n, k, group_size,
                                        per_tensor, num_sms, workspace, stream);
    case DType::kBFloat16:
      return launch_fused_typed<__nv_bfloat16>(x, ldx, repacked, scale, bias, y, m, n, k,
                                               group_size, per_tensor, num_sms, workspace,
                                               stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ternary
