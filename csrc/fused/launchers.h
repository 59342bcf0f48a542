// The launchers of the fused kernel families, declared once with their default arguments:
// csrc/fused/route.cu calls them, the *_kernel.cuh headers define them, and the instance
// files (decode_bf16.cu, decode_f16.cu, gemm.cu, wgmma_rs.cu, wgmma_big.cu) compile the
// instances the route takes, so ninja builds each family in parallel and the route's own file
// holds no kernel. bench/kernel_lab.cu instantiates them with other parameters.
#pragma once

#include "common/tu.cuh"
#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"

namespace ternary {

// fused_gemm_kernel (gemm_kernel.cuh)
template <typename T, int MT, int S, bool GROUP, bool HALF = false>
cudaError_t launch_fused(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                         const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                         int64_t group_size, bool per_tensor, int num_sms, cudaStream_t stream);
// fused_gemm_nt_kernel (gemm_nt_kernel.cuh)
template <typename T, int MT, int NT, int S, bool PF>
cudaError_t launch_gemm_nt(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                           const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                           bool per_tensor, int num_sms, cudaStream_t stream, int nwarps = 0,
                           const float* srow = nullptr);
// fused_decode_kernel (decode_kernel.cuh)
template <typename T, int S, int NB, int NT, int ABL = 0, int XS = 0, bool SE = false>
cudaError_t launch_decode(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                          const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                          bool per_tensor, int num_sms, cudaStream_t stream, int nwarps = 0,
                          const float* srow = nullptr);
// srow (decode and gemm_nt): null for activation none; for int8_per_token, x is the
// integer-valued x_q and srow its per-row scale s, and the epilogue is gemm_a8's
// (common/epilogue.cuh).
// fused_wgmma_rs2_kernel (wgmma_rs_kernel.cuh)
template <typename T, int BNX>
cudaError_t launch_wgmma_rs(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                            const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                            bool per_tensor, int splits, float* ws, cudaStream_t stream);
// fused_wgmma_big_kernel (wgmma_big_kernel.cuh)
template <typename T, int BNX, int S, int ABL = 0>
cudaError_t launch_wgmma_big(const void* x, int64_t ldx, const uint8_t* repacked,
                             const float* scale, const void* bias, void* y, int64_t m, int64_t n,
                             int64_t k, bool per_tensor, int splits, int64_t tail, float* ws,
                             int num_sms, cudaStream_t stream, const float* srow = nullptr);

inline namespace TERNARY_TU {

constexpr int kBigRows = 256, kBigStages = 6;  // the route's tile and ring (docs/kernels.md)
constexpr int kBigMinM = 32;  // M above this on Hopper may take wgmma_big (pick_route)

// Whether a wgmma_big launch of `count` tiles of bnx tokens, K split z ways over k_tiles k
// tiles, runs the persistent kernel (one block an SM over the tiles): 256-token tiles past a
// wave, unsplit. The persistent kernel keeps two stages of a tile for its output, so it needs
// two k tiles. TERNARY_PERSISTENT=0 turns it off.
bool wgmma_big_persistent(int bnx, int z, int64_t count, int sms, int64_t k_tiles) {
  return bnx == kBigRows && z == 1 && count > sms && k_tiles >= 2 && persistent_allowed();
}

}  // namespace TERNARY_TU
}  // namespace ternary
