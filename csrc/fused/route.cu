// The route: which fused kernel a call takes (pick_route), and the public entry points that
// follow it (launch_gemm_fused, gemm_fused_route, gemm_fused_plan, gemm_fused_workspace_floats,
// gemm_fused_takes_large_m). The kernels themselves compile in their families' instance files.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/layout.cuh"
#include "common/tma.cuh"
#include "fused/launchers.h"
#include "kernels.h"

namespace ternary {
namespace {

// The fp32 floats launch_wgmma_big's split parts take: `splits` parts of `split_tiles` tiles
int64_t wgmma_big_workspace_floats(int splits, int64_t split_tiles, int bnx) {
  return splits > 1 ? splits * split_tiles * bnx * 128 : 0;
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

}  // namespace

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
