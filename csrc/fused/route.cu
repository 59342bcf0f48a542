#define TERNARY_TU route_cu  // this file's namespace (common/tu.cuh)
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
inline namespace TERNARY_TU {

// The fp32 floats launch_wgmma_big's split parts take: `splits` parts of `split_tiles` tiles
int64_t wgmma_big_workspace_floats(int splits, int64_t split_tiles, int bnx) {
  return splits > 1 ? splits * split_tiles * bnx * 128 : 0;
}

// Its shared array exists only in the sm_90a image, so cudaFuncGetAttributes (no launch, no
// sync: safe while a graph is captured) tells which image the device loaded.
__global__ void sm90a_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int mark[256];
  mark[threadIdx.x] = (int)threadIdx.x;
  __syncthreads();
  if (out) *out = mark[255 - threadIdx.x];
#endif
}

}  // namespace TERNARY_TU

bool sm90a_image_loaded() {
  static std::atomic<int> state[64];  // per device: 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int v = state[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    cudaFuncAttributes a{};
    const bool yes = cudaFuncGetAttributes(&a, sm90a_probe_kernel) == cudaSuccess &&
                     a.sharedSizeBytes >= 1024;
    (void)cudaGetLastError();
    v = yes ? 2 : 1;
    state[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

inline namespace TERNARY_TU {

// wgmma_rs's plan: 128 tokens with K split until the grid is about one wave (at M = 128 on
// 11008 x 4096 that takes a quarter less time than no split; docs/kernels.md). Below M = 97 it pays
// only where K is split (a 128-token block without a split is one long chain). pick_route
// gives it only grids that wgmma_big cannot make half a wave of; the channel blocks alone
// never fill the GPU here.
struct WgmmaRsPlan {
  int bnx = 0;  // 0: not this route
  int splits = 1;
  int64_t tail = 0;  // wgmma_big: split only the last `tail` tiles (its partial wave)
};
WgmmaRsPlan wgmma_rs_plan(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms) {
  WgmmaRsPlan p;
  if (group_size != 0 || m < 65 || m > 128 || k < kTileK || !sm90a_image_loaded()) return p;
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
// The reason for each rule is beside it, here and in launch_fused_typed; the measurements are
// in docs/kernels.md.
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
    // half the SMs a block short in the last round (launch_fused_typed)
    if (tiles > 2 * sms && tiles <= 3 * sms) return {FusedKernel::kDecodeNt2W4, {}};
    return {FusedKernel::kDecodeWide, {}};
  }
  if (m > kBigMinM) {
    // wgmma_big takes a quarter to a third less time than the dequantize route (ops.cpp) where
    // its grid fills the GPU, but a block's time hardly depends on the grid below a wave, so
    // small grids lose: at least half a wave takes it (with K split up to 4 ways to get there,
    // as wgmma_rs_plan does), the dequantize route keeps the rest. Past a wave, the tiles of
    // the last, partial wave split 2 or 4 ways where K is long enough to repay the fp32 parts
    // (the gain is less than the rounds predict: the second launch and the fp32 sum are not
    // free).
    // M <= 128 takes tiles of 64 or 128 tokens, which take 10-20 % less time than fused_gemm_nt
    // at M = 64 on most shapes (docs/kernels.md).
    int bnx = m <= 64 ? 64 : m <= 128 ? 128 : kBigRows;
    if (m > 128 && k <= 8192) {
      // 128-token tiles where the 256-token grid, past a wave, leaves much of its last round
      // idle or pads M by up to half a tile: a 128-token tile costs about 0.6 of a 256-token
      // one, so they win when they need at most 1.5 x the rounds. K above 8192 keeps 256: there
      // the last round's tiles split 2 ways, which long K repays (docs/kernels.md).
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
      // still decides whether this route runs at all): halving the tile costs less than the
      // split's fp32 parts and their sum. Unsplit 256-token grids stay ahead.
      bnx = 128;
      blocks = (m + bnx - 1) / bnx * ((n + 127) / 128);
      s = split_for(blocks);
    }
    // Grids past a wave at M 33-48 take this route too: with rows g + 8 decoded in place the
    // wgmma_big loop is short enough to beat fused_gemm_nt there (docs/kernels.md).
    if (2 * blocks * s >= num_sms && k >= kTileK && sm90a_image_loaded() &&
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

bool is_decode(FusedKernel f) {
  return f == FusedKernel::kDecode || f == FusedKernel::kDecodePair ||
         f == FusedKernel::kDecodeShallow || f == FusedKernel::kDecodeWide ||
         f == FusedKernel::kDecodeNt2 || f == FusedKernel::kDecodeNt2W4;
}

// int8_per_token on the float kernels (ternary::linear_a8 up to kLinearA8FloatMaxM rows):
// the decode kernels, wgmma_big (split or not) and fused_gemm_nt carry gemm_a8's epilogue
// (common/epilogue.cuh); the calls gemm_fused would give wgmma_rs (Hopper, M 65-128 on grids
// wgmma_big cannot make half a wave of) take fused_gemm_nt.
FusedRoute pick_route_a8(int64_t m, int64_t n, int64_t k, int num_sms) {
  const FusedRoute r = pick_route(m, n, k, 0, num_sms);
  return is_decode(r.kernel) || r.kernel == FusedKernel::kWgmmaBig
             ? r : FusedRoute{FusedKernel::kGemmNt, {}};
}

// The fp32 workspace a route's split K takes (0: none)
int64_t route_workspace_floats(const FusedRoute& r, int64_t m, int64_t n) {
  if (r.kernel == FusedKernel::kWgmmaBig) {
    const int64_t tiles = (m + r.wg.bnx - 1) / r.wg.bnx * ((n + 127) / 128);
    return wgmma_big_workspace_floats(r.wg.splits, r.wg.tail ? r.wg.tail : tiles, r.wg.bnx);
  }
  return r.kernel == FusedKernel::kWgmmaRs && r.wg.splits > 1 ? r.wg.splits * m * n : 0;
}

// srow: null for gemm_fused; ternary::linear_a8's per-row s (x the integer-valued x_q,
// group_size 0) takes pick_route_a8's kernel.
template <typename T>
cudaError_t launch_fused_typed(const void* x, int64_t ldx, const uint8_t* repacked,
                               const float* scale, const void* bias, void* y, int64_t m,
                               int64_t n, int64_t k, int64_t group_size, bool per_tensor,
                               int num_sms, float* workspace, cudaStream_t stream,
                               const float* srow = nullptr) {
  // x rows arrive padded to whole tiles (ops.cpp), so k here is a multiple of 64.
  FusedRoute r = srow ? pick_route_a8(m, n, k, num_sms) : pick_route(m, n, k, group_size, num_sms);
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
    // The decode kernel (docs/kernels.md has the measurements): with one n tile a step and a
    // 4-tile ring it wins at M <= 8 on every shape; at M <= 16 it wins where the grid is one
    // block an SM and, with two n tiles a step and 4 warps, where it has 4 or more, again with
    // a 4-tile ring. Loading the scales early (SE) pays everywhere; staging x (XS) where it
    // fits (launch_decode) pays at M = 1-4. With SE the two-n-tile kernel also beats
    // fused_gemm_kernel between one and four blocks an SM at M = 16.
    case FusedKernel::kDecode:
      return launch_decode<T, 4, 1, 1, 0, 1, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream, 0, srow);
    // Two n tiles a step with 4 warps, for grids of 4 or more blocks an SM: x is read once for
    // two weight tiles, up to 11 % faster there; with fewer blocks an SM the longer steps leave
    // SMs idle and it loses (docs/kernels.md).
    case FusedKernel::kDecodePair:
      return launch_decode<T, 4, 1, 2, 0, 1, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream, 4, srow);
    // Grids of 0.5-1.5 blocks an SM: 16 warps with a 2-deep ring and x from global, up to 7 %
    // faster than kDecode when the kernel before it writes x; outside that band it loses or
    // ties, and staging x loses here (docs/kernels.md).
    case FusedKernel::kDecodeShallow:
      return launch_decode<T, 2, 1, 1, 0, 0, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream, 16, srow);
    case FusedKernel::kDecodeWide: {
      // 8 warps where the grid is at most one block an SM (at 126 registers only two 8-warp
      // blocks fit an SM), up to a third faster there; with more blocks 8 loses, except at
      // 3-4 tiles an SM (this route's grid at most two 8-warp blocks an SM). Grids of 688
      // tiles and more keep 4; between 448 and 688 tiles it is unmeasured (docs/kernels.md).
      const int64_t tiles = (n + kTileN - 1) / kTileN, blocks = (tiles + 1) / 2;
      return launch_decode<T, 4, 2, 2, 0, 0, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream,
                                                   blocks <= num_sms || tiles <= 4 * num_sms
                                                       ? 8 : 4, srow);
    }
    case FusedKernel::kDecodeNt2:
      return launch_decode<T, 4, 2, 1, 0, 0, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream, 0, srow);
    // Grids of 2-3 tiles an SM: one n tile a block, 4 warps. With two n tiles a step such a
    // grid (384 tiles, 192 blocks) leaves 60 SMs two blocks and 72 one, so this is about 10 %
    // faster; outside the band it loses (docs/kernels.md).
    case FusedKernel::kDecodeNt2W4:
      return launch_decode<T, 4, 2, 1, 0, 0, true>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                   per_tensor, num_sms, stream, 4, srow);
    case FusedKernel::kWgmmaRs:
      return launch_wgmma_rs<T, 128>(x, ldx, repacked, scale, bias, y, m, n, k, per_tensor,
                                     r.wg.splits, workspace, stream);
    case FusedKernel::kWgmmaBig:  // (8 stages at 64 and 128 tokens: docs/kernels.md)
      if (r.wg.bnx == 64)
        return launch_wgmma_big<T, 64, 8>(x, ldx, repacked, scale, bias, y, m, n, k, per_tensor,
                                          r.wg.splits, r.wg.tail, workspace, num_sms, stream,
                                          srow);
      if (r.wg.bnx == 128)
        return launch_wgmma_big<T, 128, 8>(x, ldx, repacked, scale, bias, y, m, n, k, per_tensor,
                                           r.wg.splits, r.wg.tail, workspace, num_sms, stream,
                                           srow);
      return launch_wgmma_big<T, kBigRows, kBigStages>(x, ldx, repacked, scale, bias, y, m, n, k,
                                                       per_tensor, r.wg.splits, r.wg.tail,
                                                       workspace, num_sms, stream, srow);
    case FusedKernel::kGemmNt:
      break;
  }
  // M 17-128: one m16 tile and two n tiles a warp step, 8-17 % faster than fused_gemm_kernel
  // with two m16 tiles, and the best or within 10 % of the best variant on every shape up to
  // M = 64 (docs/kernels.md). Above M = 128 ternary/kernels.py routes to dequantize + cuBLAS.
  return launch_gemm_nt<T, 1, 2, 4, true>(x, ldx, repacked, scale, bias, y, m, n, k, per_tensor,
                                          num_sms, stream, 0, srow);
}

}  // namespace TERNARY_TU

int64_t gemm_fused_workspace_floats(int64_t m, int64_t n, int64_t k, int64_t group_size,
                                    int num_sms) {
  if (m == 0 || n == 0) return 0;
  return route_workspace_floats(pick_route(m, n, k, group_size, num_sms), m, n);
}

int64_t linear_a8_workspace_floats(int64_t m, int64_t n, int64_t k, int num_sms) {
  if (m == 0 || n == 0) return 0;
  return route_workspace_floats(pick_route_a8(m, n, k, num_sms), m, n);
}

inline namespace TERNARY_TU {

const char* route_name(const FusedRoute& r) {
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

}  // namespace TERNARY_TU

const char* gemm_fused_route(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms) {
  return route_name(pick_route(m, n, k, group_size, num_sms));
}

bool linear_a8_fused_takes(int64_t m, int64_t n, int64_t k, int num_sms) {
  if (m <= 128) return true;
  // wgmma_a8's time stays flat while its grid leaves SMs idle and wgmma_big's grows with N:
  // at M = 256 on the H200 the float kernel won every shape whose int8 grid filled under half
  // the SMs (20-48 tiles) and lost every one that filled more (96-172; docs/kernels.md).
  // wgmma_big exists only in sm_90a images, so the other side is always wgmma_a8; and under
  // this rule its tiles here are always 128 tokens (256-token ones stay unsplit only where
  // their column blocks make half a wave, which this sends to wgmma_a8), never persistent.
  return m <= kLinearA8FloatMaxM && gemm_a8_wgmma_tiles(m, n) * 2 < num_sms &&
         pick_route_a8(m, n, k, num_sms).kernel == FusedKernel::kWgmmaBig;
}

const char* linear_a8_fused_route(int64_t m, int64_t n, int64_t k, int num_sms) {
  return route_name(pick_route_a8(m, n, k, num_sms));
}

cudaError_t launch_linear_a8_fused(const void* xq, int64_t ldx, const uint8_t* repacked,
                                   const float* scale, const float* s, const void* bias, void* y,
                                   DType dtype, int64_t m, int64_t n, int64_t k, bool per_tensor,
                                   int num_sms, float* workspace, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (s == nullptr || !linear_a8_fused_takes(m, n, k, num_sms)) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kHalf:
      return launch_fused_typed<__half>(xq, ldx, repacked, scale, bias, y, m, n, k, 0,
                                        per_tensor, num_sms, workspace, stream, s);
    case DType::kBFloat16:
      return launch_fused_typed<__nv_bfloat16>(xq, ldx, repacked, scale, bias, y, m, n, k, 0,
                                               per_tensor, num_sms, workspace, stream, s);
    default:
      return cudaErrorInvalidValue;
  }
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
