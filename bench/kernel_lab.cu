#define TERNARY_TU kernel_lab_cu  // this file's namespace (common/tu.cuh)
// Kernel lab: times variants of the fused kernels on raw CUDA (no torch), each checked
// against a float64 host reference on fresh random data, so one device call compares many
// variants without rebuilding the extension. It includes the fused kernels' headers
// (csrc/fused/*_kernel.cuh) and links their instance files (csrc/fused/*.cu): the variants
// are the production templates with other parameters. Built here by bench/kernel_lab.sh,
// run on the GPU machine:
//   bench/kernel_lab [--shapes 4096x22016 ...] [--m 1 4 16] [--pick PREFIX ...] [--settle MS]
//                    [--sustain MS] [--hang-s S] [--between 0|1|2] [--dequant] [--json out.json]
//   bench/kernel_lab --max-clusters   (how many clusters of 1-8 wgmma_big blocks fit at once)
//   bench/kernel_lab --only VARIANT --shape KxN --m M --reps R   (a workload for ncu)
// Timing: a CUDA graph of 20 launches, each on another copy of the weights (copies fill
// 3x the L2, so every launch reads its weights from DRAM); median of 15 replays. --settle
// idles before each timing (the clock back up after heavy cells); --sustain replays the graph
// that long first (the clock the variant's own power draw settles at, as gemm_bench.py's).
// A variant that has not finished after --hang-s seconds (default 30) ends the run with
// "HUNG: <variant and shape>" and exit status 3 (ncu's --only runs wait without a limit).
#include "../csrc/fused/decode_kernel.cuh"
#include "../csrc/fused/gemm_kernel.cuh"
#include "../csrc/fused/gemm_nt_kernel.cuh"
#include "../csrc/fused/wgmma_big_kernel.cuh"
#include "../csrc/fused/wgmma_rs_kernel.cuh"
#include "../csrc/kernels.h"
#include "cuda_check.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace ternary;
using bf16 = __nv_bfloat16;

// A kernel that never finishes (a barrier or setmaxnreg deadlock in a lab variant) would hold
// the device call to its limit: the lab's waits poll instead, and after --hang-s seconds
// (default 30) it names what was running and exits (the driver tears the context down).
std::string g_running = "setup";
int g_hang_s = 30;
template <typename Query>
void wait_or_die(Query query, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = query();
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      std::fprintf(stderr, "%s while %s: %s\n", what, g_running.c_str(), cudaGetErrorString(e));
      std::exit(2);
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(g_hang_s)) {
      std::printf("\nHUNG: %s did not finish in %d s (%s); exiting\n", g_running.c_str(),
                  g_hang_s, what);
      std::fflush(stdout);
      std::fprintf(stderr, "HUNG: %s did not finish in %d s (%s)\n", g_running.c_str(),
                   g_hang_s, what);
      std::_Exit(3);
    }
    std::this_thread::yield();  // (a spin, as the runtime's own wait: no extra idle between replays)
  }
}
void sync_or_die(cudaStream_t st) {
  wait_or_die([&] { return cudaStreamQuery(st); }, "stream sync");
}
void event_or_die(cudaEvent_t ev) {
  wait_or_die([&] { return cudaEventQuery(ev); }, "event sync");
}

// --between: a kernel that copies x into the buffer the variant then reads, before every
// launch (a stand-in for the op that produces x in a model: launched plainly, as vLLM's
// kernels are). 1: it does not trigger; 2: it triggers its dependents at once (an op written
// for programmatic dependent launch).
int g_between = 0;
template <bool TRIG>
__global__ void between_copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                    int64_t n16) {
  if (TRIG) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}
cudaError_t between_copy(const void* src, void* dst, int64_t bytes, cudaStream_t st) {
  const int64_t n16 = bytes / 16;
  const unsigned blocks = (unsigned)std::min<int64_t>((n16 + 255) / 256, 1024);
  if (g_between == 2)
    between_copy_kernel<true><<<blocks, 256, 0, st>>>((const uint4*)src, (uint4*)dst, n16);
  else
    between_copy_kernel<false><<<blocks, 256, 0, st>>>((const uint4*)src, (uint4*)dst, n16);
  return cudaGetLastError();
}

namespace {

using Launch = std::function<cudaError_t(const void* x, const uint8_t* w, const float* s,
                                         void* y, int64_t m, int64_t n, int64_t k, int sms,
                                         cudaStream_t st)>;
struct Variant {
  std::string name;
  int max_m;
  Launch run;
};

template <int NB, int NT, int ABL = 0, int S = 8, int XS = 0, bool SE = false>
Launch decode(int nwarps) {
  return [=](const void* x, const uint8_t* w, const float* s, void* y, int64_t m, int64_t n,
             int64_t k, int sms, cudaStream_t st) {
    return launch_decode<bf16, S, NB, NT, ABL, XS, SE>(x, k, w, s, nullptr, y, m, n, k, false,
                                                       sms, st, nwarps);
  };
}

template <int MT, int NT, bool PF, int S = 4>
Launch gemm_nt(int nwarps) {
  return [=](const void* x, const uint8_t* w, const float* s, void* y, int64_t m, int64_t n,
             int64_t k, int sms, cudaStream_t st) {
    return launch_gemm_nt<bf16, MT, NT, S, PF>(x, k, w, s, nullptr, y, m, n, k, false, sms, st,
                                               nwarps);
  };
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  // production routing, with the workspace it asks for (kept between calls, as a caller may)
  v.push_back({"prod", 1 << 20, [](const void* x, const uint8_t* w, const float* s, void* y,
                              int64_t m, int64_t n, int64_t k, int sms, cudaStream_t st) {
                 static float* ws = nullptr;
                 static int64_t cap = 0;
                 const int64_t need = gemm_fused_workspace_floats(m, n, k, 0, sms);
                 if (need > cap) {
                   if (ws) CK(cudaFree(ws));
                   CK(cudaMalloc(&ws, need * 4));
                   cap = need;
                 }
                 return launch_gemm_fused(x, k, w, s, nullptr, y, DType::kBFloat16, m, n, k, 0,
                                          false, sms, need ? ws : nullptr, st);
               }});
  // with --between: the copy kernel alone (no variant launch)
  v.push_back({"abl-between-only", 1 << 20,
               [](const void*, const uint8_t*, const float*, void*, int64_t, int64_t, int64_t,
                  int, cudaStream_t) { return cudaSuccess; }});
  v.push_back({"wgmma-rs-64", 128, [](const void* x, const uint8_t* w, const float* s, void* y,
                                     int64_t m, int64_t n, int64_t k, int, cudaStream_t st) {
                 return launch_wgmma_rs<bf16, 64>(x, k, w, s, nullptr, y, m, n, k, false, 1,
                                                  nullptr, st);
               }});
  // M > 128, Hopper: the warp-specialized kernel (BNX tokens a block, S x stages)
  // splits > 1 with tail: only the last, partial wave's tiles split (256-row tiles)
  auto big = [](auto launcher, int splits = 1, bool tail = false) {
    return [launcher, splits, tail](const void* x, const uint8_t* w, const float* s, void* y,
                                    int64_t m, int64_t n, int64_t k, int sms, cudaStream_t st) {
      static float* ws = nullptr;  // split-K parts, kept between calls
      static int64_t cap = 0;
      const int64_t need = splits * ((m + 255) / 256 * 256) * ((n + 127) / 128 * 128);
      if (splits > 1 && need > cap) {
        if (ws) CK(cudaFree(ws));
        CK(cudaMalloc(&ws, need * 4));
        cap = need;
      }
      const int64_t tiles = (m + 255) / 256 * ((n + 127) / 128);  // (M <= 64: any BNX's)
      return launcher(x, k, w, s, nullptr, y, m, n, k, false, splits, tail ? tiles % sms : 0, ws,
                      sms, st, nullptr);  // (no srow: activation none)
    };
  };
  v.push_back({"wgbig-256-s4", 1 << 20, big(launch_wgmma_big<bf16, 256, 4>)});
  v.push_back({"wgbig-256-s5", 1 << 20, big(launch_wgmma_big<bf16, 256, 5>)});
  v.push_back({"wgbig-256-s6", 1 << 20, big(launch_wgmma_big<bf16, 256, 6>)});
  v.push_back({"wgbig-128-s8", 1 << 20, big(launch_wgmma_big<bf16, 128, 8>)});
  v.push_back({"wgbig-128-s8-k2", 1 << 20, big(launch_wgmma_big<bf16, 128, 8>, 2)});
  v.push_back({"wgbig-128-s8-k4", 1 << 20, big(launch_wgmma_big<bf16, 128, 8>, 4)});
  v.push_back({"wgbig-256-s6-k2", 1 << 20, big(launch_wgmma_big<bf16, 256, 6>, 2)});
  v.push_back({"wgbig-256-s6-k4", 1 << 20, big(launch_wgmma_big<bf16, 256, 6>, 4)});
  v.push_back({"wgbig-256-s6-tail2", 1 << 20, big(launch_wgmma_big<bf16, 256, 6>, 2, true)});
  v.push_back({"wgbig-256-s6-tail4", 1 << 20, big(launch_wgmma_big<bf16, 256, 6>, 4, true)});
  // 64 tokens a tile, for M 17-64 (tail: only M <= 64 counts tiles right)
  // timing-only ablations of the 256-token kernel as routed (persistent past a wave): what the
  // decode, the weight stream and the wgmma each add at large M, in bursts and --sustain
  v.push_back({"abl-big-nodecode", 1 << 20, big(launch_wgmma_big<bf16, 256, 6, 1>)});
  v.push_back({"abl-big-noweights", 1 << 20, big(launch_wgmma_big<bf16, 256, 6, 2>)});
  v.push_back({"abl-big-nowgmma", 1 << 20, big(launch_wgmma_big<bf16, 256, 6, 3>)});
  v.push_back({"wgbig-64-s8", 1 << 20, big(launch_wgmma_big<bf16, 64, 8>)});
  v.push_back({"wgbig-64-s12", 1 << 20, big(launch_wgmma_big<bf16, 64, 12>)});
  v.push_back({"wgbig-64-s8-k2", 1 << 20, big(launch_wgmma_big<bf16, 64, 8>, 2)});
  v.push_back({"wgbig-64-s8-k4", 1 << 20, big(launch_wgmma_big<bf16, 64, 8>, 4)});
  v.push_back({"wgbig-64-s8-tail2", 64, big(launch_wgmma_big<bf16, 64, 8>, 2, true)});
  v.push_back({"wgbig-64-s8-tail4", 64, big(launch_wgmma_big<bf16, 64, 8>, 4, true)});
  v.push_back({"gemm-mt1-half", 8, [](const void* x, const uint8_t* w, const float* s, void* y,
                                       int64_t m, int64_t n, int64_t k, int sms,
                                       cudaStream_t st) {
                 return launch_fused<bf16, 1, 8, false, true>(x, k, w, s, nullptr, y, m, n, k, 0,
                                                              false, sms, st);
               }});
  v.push_back({"gemm-mt1", 16, [](const void* x, const uint8_t* w, const float* s, void* y,
                                  int64_t m, int64_t n, int64_t k, int sms, cudaStream_t st) {
                 return launch_fused<bf16, 1, 8, false>(x, k, w, s, nullptr, y, m, n, k, 0, false,
                                                        sms, st);
               }});
  for (int nw : {0, 4, 8, 16}) {
    const std::string w = nw ? "-w" + std::to_string(nw) : "";
    v.push_back({"dec-nb1-nt1" + w, 8, decode<1, 1>(nw)});
    v.push_back({"dec-nb1-nt2" + w, 8, decode<1, 2>(nw)});
    v.push_back({"dec-nb2-nt1" + w, 16, decode<2, 1>(nw)});
    v.push_back({"dec-nb2-nt2" + w, 16, decode<2, 2>(nw)});
  }
  // M = 1: a shallower ring for more warps an SM (the ring is 8 x 512 bytes a warp)
  v.push_back({"dec-s4-w8", 8, decode<1, 1, 0, 4>(8)});
  v.push_back({"dec-s4-w16", 8, decode<1, 1, 0, 4>(16)});
  v.push_back({"dec-s2-w16", 8, decode<1, 1, 0, 2>(16)});
  v.push_back({"dec-s4-w4", 8, decode<1, 1, 0, 4>(4)});
  // xs: x staged in shared memory first (xs2 always, xs1 where the launcher's rule lets it);
  // se: the scales loaded early (the production decode: dx-nb1-xs1-se)
  v.push_back({"dx-nb1", 8, decode<1, 1, 0, 4>(0)});
  v.push_back({"dx-nb1-se", 8, decode<1, 1, 0, 4, 0, true>(0)});
  v.push_back({"dx-nb1-xs2-se", 8, decode<1, 1, 0, 4, 2, true>(0)});
  v.push_back({"dx-nb1-xs1-se", 8, decode<1, 1, 0, 4, 1, true>(0)});
  for (int nw : {4, 8, 16})
    v.push_back({"dx-nb1-xs1-se-w" + std::to_string(nw), 8, decode<1, 1, 0, 4, 1, true>(nw)});
  // deeper rings for the production decode configurations (more weight bytes in flight)
  v.push_back({"dx-nb1-xs1-se-s6", 8, decode<1, 1, 0, 6, 1, true>(0)});
  v.push_back({"dx-nb1-xs1-se-s8", 8, decode<1, 1, 0, 8, 1, true>(0)});
  // ... and shallower (seventeenth session: the old 16-warp, 2-deep dec-s2-w16 beat the route
  // by 3-4 % at M = 1 on 4096 x 4096 and 4096 x 6144)
  v.push_back({"dx-nb1-xs1-se-s2", 8, decode<1, 1, 0, 2, 1, true>(0)});
  v.push_back({"dx-nb1-xs1-se-s2-w16", 8, decode<1, 1, 0, 2, 1, true>(16)});
  v.push_back({"dx-nb1-xs1-se-s2-w8", 8, decode<1, 1, 0, 2, 1, true>(8)});
  v.push_back({"dx-nb1-se-s2-w16", 8, decode<1, 1, 0, 2, 0, true>(16)});
  v.push_back({"dx-nb1-se-s2-w8", 8, decode<1, 1, 0, 2, 0, true>(8)});
  v.push_back({"dx-nb1-se-s2-w4", 8, decode<1, 1, 0, 2, 0, true>(4)});
  // M 9-16 (two batch blocks) with the 2-deep ring
  v.push_back({"dx-nb2nt1-se-s2", 16, decode<2, 1, 0, 2, 0, true>(0)});
  v.push_back({"dx-nb2nt1-se-s2-w8", 16, decode<2, 1, 0, 2, 0, true>(8)});
  v.push_back({"dx-nb2nt1-se-s2-w16", 16, decode<2, 1, 0, 2, 0, true>(16)});
  v.push_back({"dx-nb2nt2-se-s2-w8", 16, decode<2, 2, 0, 2, 0, true>(8)});
  v.push_back({"dx-nb2nt2-se-s2-w16", 16, decode<2, 2, 0, 2, 0, true>(16)});
  v.push_back({"dx-nb1-xs2-se-s2-w16", 8, decode<1, 1, 0, 2, 2, true>(16)});
  v.push_back({"dx-nb2nt1-se-s8", 16, decode<2, 1, 0, 8, 0, true>(0)});
  v.push_back({"dx-nb2nt2-se-s8-w8", 16, decode<2, 2, 0, 8, 0, true>(8)});
  v.push_back({"dx-nb2nt2-se-s8-w4", 16, decode<2, 2, 0, 8, 0, true>(4)});
  // two n tiles a step at M <= 8: x, its prescale and the correction shared by two tiles
  v.push_back({"dx-nb1nt2-xs1-se", 8, decode<1, 2, 0, 4, 1, true>(0)});
  for (int nw : {4, 8})
    v.push_back({"dx-nb1nt2-xs1-se-w" + std::to_string(nw), 8, decode<1, 2, 0, 4, 1, true>(nw)});
  v.push_back({"dx-nb2nt1-se", 16, decode<2, 1, 0, 4, 0, true>(0)});
  v.push_back({"dx-nb2nt1-xs2-se", 16, decode<2, 1, 0, 4, 2, true>(0)});
  v.push_back({"dx-nb2nt2-se", 16, decode<2, 2, 0, 4, 0, true>(4)});
  v.push_back({"dx-nb2nt2-se-w8", 16, decode<2, 2, 0, 4, 0, true>(8)});
  v.push_back({"dx-nb2nt1-se-w4", 16, decode<2, 1, 0, 4, 0, true>(4)});
  v.push_back({"dx-nb2nt1-se-w8", 16, decode<2, 1, 0, 4, 0, true>(8)});
  // the remaining XS / SE combinations (the tenth session's logs call them se-x1s0,
  // se-nt2-s0 and se-wide-s0, and the ones above se-x0s0, se-x0s1 and se-x1s1)
  v.push_back({"dx-nb1-xs1", 8, decode<1, 1, 0, 4, 1, false>(0)});
  v.push_back({"dx-nb2nt1", 16, decode<2, 1, 0, 4, 0, false>(0)});
  v.push_back({"dx-nb2nt2", 16, decode<2, 2, 0, 4, 0, false>(4)});
  // M 17-256: fused_gemm_kernel (warps split K, x loaded for each n tile) against
  // fused_gemm_nt_kernel (NT n tiles a warp step share one x load; PF: next x prefetched)
  auto gemm = [](auto launcher) {
    return [launcher](const void* x, const uint8_t* w, const float* s, void* y, int64_t m,
                      int64_t n, int64_t k, int sms, cudaStream_t st) {
      return launcher(x, k, w, s, nullptr, y, m, n, k, 0, false, sms, st);
    };
  };
  v.push_back({"gemm-mt2", 256, gemm(launch_fused<bf16, 2, 4, false>)});
  v.push_back({"gemm-mt4", 256, gemm(launch_fused<bf16, 4, 4, false>)});
  v.push_back({"gnt-mt1-nt2", 256, gemm_nt<1, 2, true>(0)});
  v.push_back({"gnt-mt1-nt2-w4", 256, gemm_nt<1, 2, true>(4)});
  v.push_back({"gnt-mt1-nt2-w8", 256, gemm_nt<1, 2, true>(8)});
  v.push_back({"gnt-mt1-nt4", 256, gemm_nt<1, 4, true>(0)});
  v.push_back({"gnt-mt2-nt1", 256, gemm_nt<2, 1, true>(0)});
  v.push_back({"gnt-mt2-nt2", 256, gemm_nt<2, 2, true>(0)});
  v.push_back({"gnt-mt2-nt2-nopf", 256, gemm_nt<2, 2, false>(0)});
  v.push_back({"gnt-mt2-nt2-w4", 256, gemm_nt<2, 2, true>(4)});
  v.push_back({"gnt-mt2-nt2-w8", 256, gemm_nt<2, 2, true>(8)});
  v.push_back({"gnt-mt2-nt2-s3", 256, gemm_nt<2, 2, true, 3>(0)});
  v.push_back({"gnt-mt4-nt1-nopf", 256, gemm_nt<4, 1, false>(0)});
  v.push_back({"gnt-mt2-nt4-nopf", 256, gemm_nt<2, 4, false>(0)});
  v.push_back({"gnt-mt4-nt2-nopf", 256, gemm_nt<4, 2, false>(0)});
  // ablations (timing only, wrong results): what each stage of the production M <= 8 decode
  // (dx-nb1-xs1-se) costs; before the eleventh session these were dec-nb1-nt1 (8-tile ring,
  // no XS / SE)
  v.push_back({"abl-nocorr", 8, decode<1, 1, 1, 4, 1, true>(0)});
  v.push_back({"abl-nodecode", 8, decode<1, 1, 2, 4, 1, true>(0)});
  v.push_back({"abl-nomma", 8, decode<1, 1, 4, 4, 1, true>(0)});
  v.push_back({"abl-nomma-nocorr", 8, decode<1, 1, 5, 4, 1, true>(0)});
  v.push_back({"abl-nox", 8, decode<1, 1, 8, 4, 1, true>(0)});
  v.push_back({"abl-stream-only", 8, decode<1, 1, 15, 4, 1, true>(0)});
  v.push_back({"abl-empty", 8, decode<1, 1, 31, 4, 1, true>(0)});
  // the M 9-16 instances as routed (kDecodeNt2 = dx-nb2nt1-se, kDecodeNt2W4 = dx-nb2nt1-se-w4,
  // kDecodeWide = dx-nb2nt2-se / -w8) without their x loads, and with the weight stream only
  // (timing only): what x from L2 costs at 16 tokens, where every block reads all of x
  v.push_back({"abl-m16-nt2-nox", 16, decode<2, 1, 8, 4, 0, true>(0)});
  v.push_back({"abl-m16-nt2-w4-nox", 16, decode<2, 1, 8, 4, 0, true>(4)});
  v.push_back({"abl-m16-wide-w4-nox", 16, decode<2, 2, 8, 4, 0, true>(4)});
  v.push_back({"abl-m16-wide-w8-nox", 16, decode<2, 2, 8, 4, 0, true>(8)});
  v.push_back({"abl-m16-nt2-stream", 16, decode<2, 1, 15, 4, 0, true>(0)});
  v.push_back({"abl-m16-nt2-w4-stream", 16, decode<2, 1, 15, 4, 0, true>(4)});
  v.push_back({"abl-m16-wide-w4-stream", 16, decode<2, 2, 15, 4, 0, true>(4)});
  return v;
}

uint16_t to_bf16_bits(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
double bf16_to_double(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Problem {
  int64_t n, k;
  std::vector<int8_t> codes;  // [n, k] in {-1, 0, 1}
  std::vector<float> scale;   // [n]
  int copies = 1;
  uint8_t* d_w = nullptr;  // copies x repacked bytes
  size_t wbytes = 0;
  float* d_scale = nullptr;
};

void make_problem(Problem& p, std::mt19937& rng, size_t l2) {
  std::uniform_int_distribution<int> code(-1, 1);
  std::uniform_real_distribution<float> sc(0.5f, 1.5f);
  p.codes.resize(p.n * p.k);
  for (auto& c : p.codes) c = (int8_t)code(rng);
  p.scale.resize(p.n);
  for (auto& s : p.scale) s = sc(rng);
  std::vector<uint8_t> packed(p.n * (p.k / 4), 0);
  for (int64_t r = 0; r < p.n; ++r)
    for (int64_t c = 0; c < p.k; ++c)
      packed[r * (p.k / 4) + c / 4] |= (uint8_t)((p.codes[r * p.k + c] + 1) << (2 * (c % 4)));
  uint8_t* d_packed;
  CK(cudaMalloc(&d_packed, packed.size()));
  CK(cudaMemcpy(d_packed, packed.data(), packed.size(), cudaMemcpyHostToDevice));
  p.wbytes = (size_t)((p.n + 31) / 32) * ((p.k + 63) / 64) * 512;
  p.copies = (int)std::max<size_t>(1, (3 * l2 + p.wbytes - 1) / p.wbytes);
  CK(cudaMalloc(&p.d_w, p.wbytes * p.copies));
  for (int c = 0; c < p.copies; ++c)
    CK(launch_repack(d_packed, p.d_w + c * p.wbytes, p.n, p.k, 0));
  CK(cudaFree(d_packed));
  CK(cudaMalloc(&p.d_scale, p.n * sizeof(float)));
  CK(cudaMemcpy(p.d_scale, p.scale.data(), p.n * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());
}

std::vector<int64_t> parse_ints(int& i, int argc, char** argv) {
  std::vector<int64_t> out;
  while (i + 1 < argc && argv[i + 1][0] != '-') out.push_back(std::atoll(argv[++i]));
  return out;
}

// The large-M route's dequantize: dequantize_repacked (from the tiles) against the canonical
// dequantize (pack.cu), same codes and scales; they must agree bit for bit.
bool time_dequantize(const std::vector<std::pair<int64_t, int64_t>>& shapes, cudaStream_t st,
                     cudaEvent_t e0, cudaEvent_t e1, size_t l2) {
  bool ok = true;
  std::printf("\ndequantize to bf16 (us, median of 15; weights rotated past L2)\n");
  std::printf("%-14s %12s %12s %10s\n", "K x N", "canonical", "repacked", "identical");
  std::mt19937 rng(7);
  for (const auto& shape : shapes) {
    const int64_t k = shape.first, n = shape.second;
    std::vector<uint8_t> packed(n * (k / 4));
    for (auto& b : packed) {
      b = 0;
      for (int j = 0; j < 4; ++j) b |= (uint8_t)((rng() % 3) << (2 * j));
    }
    const size_t pbytes = packed.size(), rbytes = (size_t)((n + 31) / 32) * ((k + 63) / 64) * 512;
    const int copies = (int)std::max<size_t>(2, (3 * l2 + pbytes - 1) / pbytes);
    uint8_t *d_p, *d_r;
    CK(cudaMalloc(&d_p, pbytes * copies));
    CK(cudaMalloc(&d_r, rbytes * copies));
    for (int c = 0; c < copies; ++c) {
      CK(cudaMemcpy(d_p + c * pbytes, packed.data(), pbytes, cudaMemcpyHostToDevice));
      CK(launch_repack(d_p + c * pbytes, d_r + c * rbytes, n, k, st));
    }
    std::vector<float> sh(n);
    for (auto& s : sh) s = 0.5f + (rng() % 1000) / 1000.f;
    float* d_s;
    CK(cudaMalloc(&d_s, n * 4));
    CK(cudaMemcpy(d_s, sh.data(), n * 4, cudaMemcpyHostToDevice));
    void *d_a, *d_b;
    CK(cudaMalloc(&d_a, n * k * 2));
    CK(cudaMalloc(&d_b, n * k * 2));
    float us[2];
    for (int which = 0; which < 2; ++which) {
      auto run = [&](int c) {
        return which == 0 ? launch_dequantize(d_p + c * pbytes, d_s, d_a, DType::kBFloat16, n, k, 0,
                                              false, st)
                          : launch_dequantize_repacked(d_r + c * rbytes, d_s, d_b,
                                                       DType::kBFloat16, n, k, 0, false, st);
      };
      CK(run(0));
      for (int w = 0; w < 3; ++w) CK(run(w % copies));
      std::vector<float> times;
      for (int r = 0; r < 15; ++r) {
        CK(cudaEventRecord(e0, st));
        CK(run(r % copies));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms_ = 0;
        CK(cudaEventElapsedTime(&ms_, e0, e1));
        times.push_back(ms_ * 1000.f);
      }
      std::sort(times.begin(), times.end());
      us[which] = times[times.size() / 2];
    }
    CK(launch_dequantize(d_p, d_s, d_a, DType::kBFloat16, n, k, 0, false, st));
    CK(launch_dequantize_repacked(d_r, d_s, d_b, DType::kBFloat16, n, k, 0, false, st));
    CK(cudaStreamSynchronize(st));
    std::vector<uint16_t> a(n * k), b(n * k);
    CK(cudaMemcpy(a.data(), d_a, n * k * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), d_b, n * k * 2, cudaMemcpyDeviceToHost));
    const bool same = a == b;
    ok &= same;
    std::printf("%6ld x %-6ld %12.1f %12.1f %10s\n", k, n, us[0], us[1], same ? "yes" : "NO");
    CK(cudaFree(d_p));
    CK(cudaFree(d_r));
    CK(cudaFree(d_s));
    CK(cudaFree(d_a));
    CK(cudaFree(d_b));
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 22016}, {11008, 4096}, {4096, 4096}};
  std::vector<int64_t> ms = {1, 4, 8, 16};
  std::string only, json;
  std::vector<std::string> pick;  // --pick a b c: time only variants whose names start so
  int reps = 3, settle_ms = 0, sustain_ms = 0;  // --settle, --sustain: see the top
  bool dequant = false, max_clusters = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto shape_of = [](const char* s) {
      int64_t k = 0, n = 0;
      if (std::sscanf(s, "%ldx%ld", &k, &n) != 2) {
        std::fprintf(stderr, "bad shape '%s': want KxN\n", s);
        std::exit(2);
      }
      return std::make_pair(k, n);
    };
    if (a == "--shapes" || a == "--shape") {
      shapes.clear();
      while (i + 1 < argc && argv[i + 1][0] != '-') shapes.push_back(shape_of(argv[++i]));
    } else if (a == "--m") {
      ms = parse_ints(i, argc, argv);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--pick") {
      while (i + 1 < argc && argv[i + 1][0] != '-') pick.push_back(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--settle" && i + 1 < argc) {
      settle_ms = std::atoi(argv[++i]);
    } else if (a == "--hang-s" && i + 1 < argc) {
      g_hang_s = std::atoi(argv[++i]);
    } else if (a == "--sustain" && i + 1 < argc) {
      sustain_ms = std::atoi(argv[++i]);
    } else if (a == "--between" && i + 1 < argc) {
      g_between = std::atoi(argv[++i]);
    } else if (a == "--dequant") {
      dequant = true;
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--max-clusters") {
      max_clusters = true;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  if (max_clusters) {
    // how many clusters of c blocks of the 64-token wgmma_big (one block an SM) run at once
    // (a K split as a cluster needs all of them resident: bench/NOTES.md, eighteenth session)
    auto kern = fused_wgmma_big_kernel<bf16, 64, 8, false>;
    constexpr int kSmem = wgmma_big_smem<64, 8>();
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    for (int c : {1, 2, 4, 8}) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(1, 1, c);
      cfg.blockDim = dim3(384);
      cfg.dynamicSmemBytes = kSmem;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = 1;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = c;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int count = 0;
      CK(cudaOccupancyMaxActiveClusters(&count, kern, &cfg));
      std::printf("clusters of %d blocks (wgmma_big, 64 tokens) at once: %d (%d blocks)\n", c,
                  count, c * count);
    }
    return 0;
  }
  std::mt19937 rng(12345);
  const auto vars = variants();
  FILE* js = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
  if (js) std::fprintf(js, "{\"device\": \"%s\", \"rows\": [\n", prop.name);
  bool first_row = true, failed = false;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (auto [k, n] : shapes) {
    Problem p;
    p.n = n;
    p.k = k;
    make_problem(p, rng, prop.l2CacheSize);
    const int64_t mmax = *std::max_element(ms.begin(), ms.end());
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> xh(mmax * k);
    for (auto& v : xh) v = to_bf16_bits(nd(rng));
    void *d_x, *d_x2, *d_y;
    CK(cudaMalloc(&d_x, xh.size() * 2));
    CK(cudaMalloc(&d_x2, xh.size() * 2));
    CK(cudaMemcpy(d_x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_y, mmax * n * 2));
    std::printf("\nK x N = %ld x %ld: weights %.1f MB (x%d copies), 2-bit floor at 4.16 TB/s %.2f us\n",
                k, n, p.wbytes / 1e6, p.copies, p.wbytes / 4.16e12 * 1e6);
    std::printf("%-32s", "variant \\ M");
    for (auto m : ms) std::printf(" %12ld", m);
    std::printf("\n");
    // float64 reference, one per M; above 128 rows only every row_step(m)-th row (and the
    // last) is computed and checked: the host reference of M = 4096 would take minutes
    auto row_step = [](int64_t m) { return m <= 128 ? (int64_t)1 : m / 61; };
    auto checked = [&](int64_t r, int64_t m) { return r % row_step(m) == 0 || r == m - 1; };
    std::vector<std::vector<double>> ref(ms.size());
    for (size_t mi = 0; mi < ms.size(); ++mi) {
      if (!only.empty()) break;
      const int64_t m = ms[mi];
      ref[mi].assign(m * n, 0.0);
      std::vector<double> xd(k);
      for (int64_t r = 0; r < m; ++r) {
        if (!checked(r, m)) continue;
        for (int64_t c = 0; c < k; ++c) xd[c] = bf16_to_double(xh[r * k + c]);
        for (int64_t o = 0; o < n; ++o) {
          const int8_t* cr = &p.codes[o * k];
          double acc = 0;
          for (int64_t c = 0; c < k; ++c) acc += xd[c] * cr[c];
          ref[mi][r * n + o] = acc * p.scale[o];
        }
      }
    }
    // --pick's order (each prefix's variants in list order, each once), so a second run can
    // time them in reverse
    std::vector<const Variant*> order;
    for (const auto& v : vars)
      if (pick.empty()) order.push_back(&v);
    for (const auto& pf : pick)
      for (const auto& v : vars)
        if (v.name.rfind(pf, 0) == 0 && std::find(order.begin(), order.end(), &v) == order.end())
          order.push_back(&v);
    for (const Variant* vp : order) {
      const Variant& v = *vp;
      if (!only.empty() && v.name != only) continue;
      std::printf("%-32s", v.name.c_str());
      for (size_t mi = 0; mi < ms.size(); ++mi) {
        const int64_t m = ms[mi];
        if (m > v.max_m) {
          std::printf(" %12s", "-");
          continue;
        }
        if (!only.empty()) {  // ncu workload: a few plain launches
          // (a plain wait: under ncu one launch is replayed for minutes)
          for (int r = 0; r < reps; ++r)
            CK(v.run(d_x, p.d_w + (r % p.copies) * p.wbytes, p.d_scale, d_y, m, n, k, sms, st));
          CK(cudaStreamSynchronize(st));
          std::printf(" %12s", "ran");
          continue;
        }
        // correctness: poison, run once, compare every element
        g_running = v.name + " K=" + std::to_string(k) + " N=" + std::to_string(n) + " M=" +
                    std::to_string(m);
        CK(cudaMemsetAsync(d_y, 0xFF, m * n * 2, st));
        if (v.run(d_x, p.d_w, p.d_scale, d_y, m, n, k, sms, st) == cudaErrorInvalidValue) {
          (void)cudaGetLastError();  // a variant that does not take this shape
          std::printf(" %12s", "n/a");
          continue;
        }
        sync_or_die(st);
        std::vector<uint16_t> yh(m * n);
        CK(cudaMemcpy(yh.data(), d_y, m * n * 2, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        bool finite = true;
        for (int64_t i = 0; i < m * n; ++i) {
          if (!checked(i / n, m)) continue;
          const double yv = bf16_to_double(yh[i]);
          if (!std::isfinite(yv)) finite = false;
          num += (yv - ref[mi][i]) * (yv - ref[mi][i]);
          den += ref[mi][i] * ref[mi][i];
        }
        const double rel = std::sqrt(num / den);
        const bool ablation = v.name.rfind("abl-", 0) == 0;
        if (!ablation && (!finite || !(rel < 1e-2))) {
          std::printf(" %12s", "WRONG");
          std::fprintf(stderr, "%s K=%ld N=%ld M=%ld: rel err %.3g finite %d\n", v.name.c_str(),
                       k, n, m, rel, (int)finite);
          failed = true;
          continue;
        }
        // timing: a graph of 20 launches over rotating weight copies
        constexpr int kLaunches = 20;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int r = 0; r < kLaunches; ++r) {
          if (g_between) CK(between_copy(d_x, d_x2, m * k * 2, st));
          CK(v.run(g_between ? d_x2 : d_x, p.d_w + (r % p.copies) * p.wbytes, p.d_scale, d_y, m,
                   n, k, sms, st));
        }
        CK(cudaStreamEndCapture(st, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        if (settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
        if (sustain_ms > 0) {
          const auto t0 = std::chrono::steady_clock::now();
          while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(sustain_ms)) {
            for (int w = 0; w < 4; ++w) CK(cudaGraphLaunch(exec, st));
            sync_or_die(st);
          }
        }
        for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(exec, st));
        std::vector<float> times;
        for (int r = 0; r < 15; ++r) {
          CK(cudaEventRecord(e0, st));
          CK(cudaGraphLaunch(exec, st));
          CK(cudaEventRecord(e1, st));
          event_or_die(e1);
          float ms_ = 0;
          CK(cudaEventElapsedTime(&ms_, e0, e1));
          times.push_back(ms_ * 1000.f / kLaunches);
        }
        std::sort(times.begin(), times.end());
        const float us = times[times.size() / 2];
        std::printf(" %12.2f", us);
        if (js) {
          std::fprintf(js, "%s{\"variant\": \"%s\", \"k\": %ld, \"n\": %ld, \"m\": %ld, \"us\": %.3f, "
                           "\"rel_err\": %.3g}",
                       first_row ? "" : ",\n", v.name.c_str(), k, n, m, us, rel);
          first_row = false;
        }
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    CK(cudaFree(d_x));
    CK(cudaFree(d_x2));
    CK(cudaFree(d_y));
    CK(cudaFree(p.d_w));
    CK(cudaFree(p.d_scale));
  }
  if (js) {
    std::fprintf(js, "\n]}\n");
    std::fclose(js);
  }
  if (dequant && only.empty()) failed |= !time_dequantize(shapes, st, e0, e1, prop.l2CacheSize);
  std::printf("\n%s\n", failed ? "SOME VARIANTS WRONG" : "all variants match float64");
  return failed ? 1 : 0;
}
