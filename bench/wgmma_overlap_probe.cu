#define TERNARY_TU wgmma_overlap_probe_cu  // this file's namespace (common/tu.cuh)
// Does wgmma_big's decode overlap tensor work issued by another warp on the same SM, and does
// that depend on the wgmma's N (tokens)? The production ablations (tenth, fifteenth session)
// show that at 64 tokens a k tile costs the decode's time plus the tensor time, while at 256
// tokens the decode hides; and a second block an SM did not help at 64. This probe separates
// the parts of a consumer's k step into roles a warpgroup can take on its own:
//   T    four RS wgmma m64nNk16 on fixed A registers, commit, wait for the previous group
//   TS   the same with A from shared memory (SS wgmma)
//   D    wgmma_big's decode of one k tile (its LDS of the raw piece, prmt, shuffles, lop3, add)
//   DP   a decode with no exchange between lanes (a layout production does not have: each
//        lane's own 8 bytes a k tile, one LDS.64), DR the same on a word kept in registers
//   TD, TDP, TDR  the wgmma and a decode in one warpgroup, as the production loop runs them
//        (the decode of A(kt + 1) while wgmma(kt) is in flight)
//   -    idle (exits at once)
// One block an SM, every warpgroup of a block starts together; each reports the cycles its
// loop took (clock64) per iteration (one k tile). If T and D in different warpgroups run at
// their solo rates, the tensor pipe and the ALU overlap across warps; if D slows while T runs,
// they share an SM resource. Measured on the H200 (bench/NOTES.md, seventeenth session): D
// slows to 37-48 % of its rate while two warpgroups keep the tensor pipe busy, with A from
// registers or from shared memory.
// Built here (sm_90a, any CUDA >= 12.4 nvcc):
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        bench/wgmma_overlap_probe.cu -o bench/wgmma_overlap_probe
// and run on the GPU machine (carry the binary): bench/wgmma_overlap_probe [iters]. Prints a
// table.
#include "../csrc/common/mma.cuh"
#include "../csrc/common/wgmma.cuh"
#include "cuda_check.cuh"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace ternary;
using bf16 = __nv_bfloat16;

// DP: a decode with no exchange between lanes, for a layout (not the production one) that gives
// each lane its own 8 bytes a k tile: one LDS.64, then per word the shifts 0, 2, 8, 10 put row
// g's codes at bits 0-1 / 16-17 and row g + 8's at 4-5 / 20-21 (as the production decode reads
// them). DR: DP's arithmetic on a word kept in registers (no LDS).
// TS: T with A from shared memory too (SS wgmma on a fixed 64 x 64 tile): does the ALU slow
// down for RS's register reads or for any tensor work?
enum Role { kIdle = 0, kT = 1, kD = 2, kTD = 3, kDP = 4, kTDP = 5, kDR = 6, kTDR = 7, kTS = 8 };
constexpr int kRawBytes = 8192;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // common/wgmma.cuh's helpers exist in the sm_90a pass only
__device__ __forceinline__ void probe_decode_private(const uint2& q, uint32_t (&a)[4][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t w = (s >> 1) ? q.y : q.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int sh = 8 * (s & 1) + 2 * (i >> 1);
      const uint32_t v = sh ? w >> sh : w;
      a[s][i] = add_x2((bf16*)nullptr,
                       lop3_and_or(v, (i & 1) ? 0x00300030u : 0x00030003u, WgDec<bf16>::kMagic),
                       (i & 1) ? WgDec<bf16>::kSub16 : WgDec<bf16>::kSub);
    }
  }
}

template <int N> struct ProbeSS;
#define PROBE_SS(N, TAIL, PRED)                                                                \
  template <> struct ProbeSS<N> {                                                              \
    static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t da, uint64_t db) {  \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                          \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "                 \
                   TERNARY_WG_D##N##_REGS ", " TAIL ", p, 1, 1, 0, 0;\n}\n"                    \
                   : TERNARY_WG_D##N##_OUTS                                                    \
                   : "l"(da), "l"(db), "r"(1));                                                \
    }                                                                                          \
  };
PROBE_SS(64, "%32, %33", "%34")
PROBE_SS(128, "%64, %65", "%66")
#undef PROBE_SS

template <int ROLE, int N>
__device__ __forceinline__ void probe_loop(int iters, int lane, int t, uint32_t sel, uint32_t lo,
                                           const uint4* raw, float (&d)[N / 2],
                                           uint32_t (&a)[2][4][4], uint4& q, uint2& q2,
                                           uint32_t& acc) {
  constexpr bool kMma = ROLE == kT || ROLE == kTD || ROLE == kTDP || ROLE == kTDR || ROLE == kTS;
  constexpr bool kPriv = ROLE == kDP || ROLE == kTDP || ROLE == kDR || ROLE == kTDR;
  constexpr bool kProd = ROLE == kD || ROLE == kTD;
  const uint2* const raw2 = reinterpret_cast<const uint2*>(raw);
  for (int it = 0; it < iters; it += 2) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if constexpr (ROLE == kTS) {
        // A: a 64 x 64 tile after the raw pieces (lo_a), B as T's
        const uint32_t lo_a = lo + ((N * 128 + kRawBytes) >> 4);
        wg_pin(d);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; ++s)
          ProbeSS<N>::run(d, wg_desc(lo_a + kWgStepLo * s), wg_desc(lo + kWgStepLo * s));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
      } else if constexpr (kMma) {
        wg_mma_tile<bf16, N>(d, a[u], lo);
      }
      if constexpr (kPriv) {
        wg_pin(a[u ^ 1]);
        probe_decode_private(q2, a[u ^ 1]);
        wg_pin(a[u]);
        if constexpr (kMma) wg_pin(d);  // (on a path without wgmma ptxas would serialize: C7515)
        if constexpr (ROLE == kDP || ROLE == kTDP)
          q2 = raw2[((it + u) * 32 + lane) & (kRawBytes / 8 - 1)];
        else
          q2 = make_uint2(q2.y ^ (uint32_t)it, q2.x + 0x9E3779B9u);
      }
      if constexpr (kProd) {
        wg_pin(a[u ^ 1]);
        wg_big_decode<bf16>(q, a[u ^ 1], t, sel);  // production's decode
        wg_pin(a[u]);
        if constexpr (kMma) wg_pin(d);  // (on a path without wgmma ptxas would serialize: C7515)
        q = raw[((it + u) * 32 + lane) & (kRawBytes / 16 - 1)];
      }
      if constexpr (!kMma && ROLE != kIdle) acc ^= a[u ^ 1][0][0] ^ a[u ^ 1][3][3];
    }
  }
}
#endif

// A block's warpgroups take role RA or RB (or none): `pick` holds 2 bits a warpgroup (0 idle,
// 1 RA, 2 RB). At most one of RA, RB issues wgmma: with wgmma on two divergent paths ptxas
// serializes every wgmma (C7520; the second version of this probe).
template <int N, int NWG, int RA, int RB>
__global__ void __launch_bounds__(128 * NWG, 1)
probe_kernel(int pick, int iters, long long* cycles, float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (sraw + 1023) & ~1023u;
  uint8_t* const sbase = smem_raw + (base - sraw);
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, t = lane & 3;
  // B (x) tile: N tokens x 64 k, bf16 values in [-1, 1) (nonzero data: the tensor pipe's
  // power depends on it); then the raw weight pieces the decode reads
  for (int i = tid; i < N * 64; i += blockDim.x) {
    const uint32_t h = (uint32_t)i * 2654435761u + blockIdx.x;
    reinterpret_cast<bf16*>(sbase)[i] = __float2bfloat16((float)(h >> 8 & 1023) / 512.f - 1.f);
  }
  uint4* const raw = reinterpret_cast<uint4*>(sbase + N * 128);
  for (int i = tid; i < kRawBytes / 16; i += blockDim.x) {
    const uint32_t h = (uint32_t)i * 2246822519u + 7u * blockIdx.x;
    // 2-bit codes 0..2 only (3 is not a ternary code)
    uint32_t w[4];
    for (int j = 0; j < 4; ++j) {
      uint32_t v = 0, x = h ^ (j * 0x9E3779B9u);
      for (int c = 0; c < 16; ++c) { x = x * 1664525u + 1013904223u; v |= ((x >> 29) % 3) << (2 * c); }
      w[j] = v;
    }
    raw[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const int role = (pick >> (2 * wg)) & 3;
  // TS's A tile: 64 rows x 128 bytes of bf16 values in [-1, 1)
  for (int i = tid; i < 64 * 64; i += blockDim.x)
    reinterpret_cast<bf16*>(sbase + N * 128 + kRawBytes)[i] =
        __float2bfloat16((float)(((uint32_t)i * 40503u) >> 6 & 1023) / 512.f - 1.f);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (role == 0) return;
  const uint32_t lo = wg_desc_lo(base), sel = 0x6240u + 0x1111u * (uint32_t)((tid >> 6) & 1);
  float d[N / 2];
  zero(d);
  uint32_t a[2][4][4];
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[0][s][i] = a[1][s][i] = 0x3F803F80u ^ (uint32_t)(s + i);
  uint32_t acc = 0;
  uint4 q = raw[lane];
  uint2 q2 = reinterpret_cast<const uint2*>(raw)[lane];
  const long long c0 = clock64();
  // one loop per role, each compiled on its own (a role test inside the loop cost the
  // first version of this probe 30-90 cycles an iteration)
  if (role == 1)
    probe_loop<RA, N>(iters, lane, t, sel, lo, raw, d, a, q, q2, acc);
  else
    probe_loop<RB, N>(iters, lane, t, sel, lo, raw, d, a, q, q2, acc);
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_pin(d);
  const long long c1 = clock64();
  float s = (float)acc;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += d[i];
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) s += (float)(a[k][j][i] & 1);
  sink[blockIdx.x * blockDim.x + tid] = s;
  if ((tid & 127) == 0) cycles[blockIdx.x * 4 + wg] = c1 - c0;
#endif
}

const char* role_name(int r) {
  static const char* names[] = {"-", "T", "D", "TD", "DP", "TDP", "DR", "TDR", "TS"};
  return names[r];
}

// pattern: one letter a warpgroup, 'a' (RA), 'b' (RB) or '-'
template <int N, int NWG, int RA, int RB>
void run(const char* pattern, int iters, int sms, long long* dcyc, float* dsink) {
  // B, the raw pieces, TS's A tile (8 KB), padding: one block an SM
  const size_t smem = 1024 + N * 128 + kRawBytes + 64 * 1024;
  auto kernel = probe_kernel<N, NWG, RA, RB>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int pick = 0, roles[4] = {0, 0, 0, 0};
  for (int w = 0; w < NWG; ++w) {
    const int r = pattern[w] == 'a' ? 1 : pattern[w] == 'b' ? 2 : 0;
    pick |= r << (2 * w);
    roles[w] = r == 1 ? RA : r == 2 ? RB : kIdle;
  }
  CK(cudaMemset(dcyc, 0, sms * 4 * sizeof(long long)));
  // warm-up, then the timed launch
  kernel<<<sms, 128 * NWG, smem>>>(pick, iters / 4, dcyc, dsink);
  CK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  kernel<<<sms, 128 * NWG, smem>>>(pick, iters, dcyc, dsink);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  std::vector<long long> h(sms * 4);
  CK(cudaMemcpy(h.data(), dcyc, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::string label;
  for (int w = 0; w < NWG; ++w) label += std::string(w ? "," : "") + role_name(roles[w]);
  std::printf("%5d %-14s %9.1f", N, label.c_str(), ms * 1e3 / iters * 1e3);
  for (int w = 0; w < 4; ++w) {
    if (w >= NWG || roles[w] == kIdle) { std::printf(" %9s", "-"); continue; }
    double sum = 0;
    for (int b = 0; b < sms; ++b) sum += (double)h[b * 4 + w];
    std::printf(" %9.1f", sum / sms / iters);
  }
  std::printf("\n");
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 4000;
  int dev = 0, sms = 0, clk = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
  long long* dcyc;
  float* dsink;
  CK(cudaMalloc(&dcyc, sms * 4 * sizeof(long long)));
  CK(cudaMalloc(&dsink, sms * 512 * sizeof(float)));
  std::printf("wgmma/decode overlap probe: %d blocks (one an SM), %d iterations (k tiles), "
              "max clock %d MHz\n", sms, iters, clk / 1000);
  std::printf("roles per warpgroup: T = 4 RS wgmma m64nNk16 + commit + wait(1); D = one k "
              "tile's decode; TD = both (production)\n");
  std::printf("%5s %-14s %9s %9s %9s %9s %9s\n", "N", "roles", "ps/iter", "wg0 cyc", "wg1 cyc",
              "wg2 cyc", "wg3 cyc");
#define P(N, NWG, RA, RB, PAT) run<N, NWG, RA, RB>(PAT, iters, sms, dcyc, dsink)
  P(64, 2, kT, kD, "a-");
  P(64, 2, kT, kD, "aa");
  P(64, 2, kT, kD, "b-");
  P(64, 2, kT, kD, "bb");
  P(64, 2, kT, kD, "ab");
  P(64, 2, kTD, kD, "a-");
  P(64, 2, kTD, kD, "aa");
  P(64, 4, kT, kD, "aabb");
  P(64, 4, kT, kD, "abbb");
  P(64, 4, kT, kD, "bb--");
  P(64, 4, kTD, kD, "aaaa");
  P(64, 2, kT, kDP, "b-");
  P(64, 2, kT, kDP, "bb");
  P(64, 2, kT, kDP, "ab");
  P(64, 2, kTDP, kDP, "a-");
  P(64, 2, kTDP, kDP, "aa");
  P(64, 4, kT, kDP, "aabb");
  P(64, 4, kTDP, kDP, "aaaa");
  P(64, 2, kT, kDR, "bb");
  P(64, 4, kT, kDR, "aabb");
  P(64, 2, kTDR, kDR, "aa");
  P(64, 2, kTS, kD, "a-");
  P(64, 2, kTS, kD, "aa");
  P(64, 2, kTS, kD, "ab");
  P(64, 4, kTS, kD, "aabb");
  P(64, 4, kTS, kDR, "aabb");
  P(128, 2, kTS, kD, "aa");
  P(128, 2, kTS, kD, "ab");
  P(128, 2, kT, kD, "a-");
  P(128, 2, kT, kD, "aa");
  P(128, 2, kT, kD, "ab");
  P(128, 2, kTD, kD, "aa");
  P(128, 2, kTDP, kD, "aa");
  P(256, 2, kT, kD, "a-");
  P(256, 2, kT, kD, "aa");
  P(256, 2, kT, kD, "ab");
  P(256, 2, kTD, kD, "aa");
  P(256, 2, kTDP, kD, "aa");
#undef P
  std::printf("cycles: a warpgroup's loop per iteration (one k tile), mean over blocks; at the "
              "full tensor rate an SM does m64n64k16 in 32 cycles (T alone at N = 64: 128)\n");
  return 0;
}
