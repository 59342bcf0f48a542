// Launchers of the CUDA kernels in *.cu. Plain C++ types only: the .cu files include
// cuda_runtime.h and nothing of ATen, which keeps nvcc 3.5x faster (docs/build.md, Build speed).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace ternary {

enum class DType : int { kHalf = 0, kBFloat16 = 1, kFloat = 2 };

// codes int8 [n, k] in {-1,0,1} -> packed uint8 [n, k/4]
cudaError_t launch_pack(const int8_t* codes, uint8_t* packed, int64_t n, int64_t k,
                        cudaStream_t stream);
// packed uint8 [n, k/4] -> codes int8 [n, k]
cudaError_t launch_unpack(const uint8_t* packed, int8_t* codes, int64_t n, int64_t k,
                          cudaStream_t stream);
// packed + scale -> dense [n, k] of dtype. scale_cols = 1 (channel), 0 (tensor: one value),
// or ceil(k/group_size) (group).
cudaError_t launch_dequantize(const uint8_t* packed, const float* scale, void* out, DType dtype,
                              int64_t n, int64_t k, int64_t group_size, bool per_tensor,
                              cudaStream_t stream);
// y[m, n] = sum_k x[m, k] * w[n, k] * scale + bias[n]; x, y, bias of dtype, row-major,
// x rows `ldx` elements apart.
cudaError_t launch_gemm(const void* x, int64_t ldx, const uint8_t* packed, const float* scale,
                        const void* bias, void* y, DType dtype, int64_t m, int64_t n, int64_t k,
                        int64_t group_size, bool per_tensor, cudaStream_t stream);

// W1.58A8 on int8 tensor cores (gemm_a8.cu): y[m, n] = (xq[m, :] . w[n, :]) * scale / s[m]
// (+ bias[n]) from the canonical packed [n, k/4] codes; xq int8 [m, k] (rows k bytes apart,
// 4-byte aligned, k a multiple of 4), s float32 [m] (x_q = round(x * s)), scale float32 [n]
// or one value (per_tensor). kInt32 writes the raw int32 sums (no scale, s or bias).
enum class A8Out : int { kHalf = 0, kBFloat16 = 1, kFloat = 2, kInt32 = 3 };
cudaError_t launch_gemm_a8(const int8_t* xq, const float* s, const uint8_t* packed,
                           const float* scale, const void* bias, void* y, A8Out out, int64_t m,
                           int64_t n, int64_t k, bool per_tensor, cudaStream_t stream);
// The same from the repacked tiles (gemm_a8_tc.cu): k a multiple of 16, xq and repacked
// 16-byte aligned (cudaErrorInvalidValue otherwise; the op pads x to such a k).
cudaError_t launch_gemm_a8_repacked(const int8_t* xq, const float* s, const uint8_t* repacked,
                                    const float* scale, const void* bias, void* y, A8Out out,
                                    int64_t m, int64_t n, int64_t k, bool per_tensor,
                                    cudaStream_t stream);

// Whether the current device loaded the library's sm_90a image (fused/route.cu): the
// wgmma kernels' bodies exist only there.
bool sm90a_image_loaded();
// The same on Hopper's int8 wgmma (fused/wgmma_a8.cu, sm_90a builds only, where
// sm90a_image_loaded): x_q first goes through
// launch_a8_permute into xp [m, gemm_a8_wgmma_kp(k)] (the kernel's k order, zero padded) and
// rsum [m] (its row sums); then launch_gemm_a8_wgmma. xp and repacked 16-byte aligned.
int64_t gemm_a8_wgmma_kp(int64_t k);
// The kernel's grid: its 128-token x 256-channel tiles over [m, n]
int64_t gemm_a8_wgmma_tiles(int64_t m, int64_t n);
cudaError_t launch_a8_permute(const int8_t* xq, int64_t ldq, int64_t k, int8_t* xp, int32_t* rsum,
                              int64_t m, cudaStream_t stream);
cudaError_t launch_gemm_a8_wgmma(const int8_t* xp, const float* s, const int32_t* rsum,
                                 const uint8_t* repacked, const float* scale, const void* bias,
                                 void* y, A8Out out, int64_t m, int64_t n, int64_t k,
                                 bool per_tensor, cudaStream_t stream);
// gemm_a8_repacked takes the wgmma kernel from this many rows where it is compiled
constexpr int64_t kA8WgmmaMinM = 128;

// ternary::linear_a8, activation int8_per_token in one op: x -> (x_q, s) per token, then
// y = (x_q . w) * scale / s (+ bias), gemm_a8's result bit for bit on every route.
// Up to kLinearA8FloatMaxM rows (and K below kLinearA8FloatMaxK, float16/bfloat16 x) x_q stays
// in x's dtype and takes the float kernels with gemm_a8's epilogue
// (launch_linear_a8_fused, linear_a8_fused_takes): at M <= 128, and on Hopper up to
// M = 256 where gemm_fused takes wgmma_big and wgmma_a8's 128 x 256 tiles would fill fewer
// than half the SMs, they are faster than both int8 kernels (docs/kernels.md). Elsewhere, or
// for float32 x or longer K, x_q is int8 and gemm_a8_repacked's kernels run. K * 256 < 2^24
// keeps the float kernels' sums exact integers (their codes c = w + 1 <= 2 times
// |x_q| <= 128).
constexpr int64_t kLinearA8FloatMaxM = 256;
constexpr int64_t kLinearA8FloatMaxK = 65536;
// x_q of dtype (half or bfloat16; integer-valued, rows ldx elements apart, padded with zeros
// to k, a multiple of 64, as gemm_fused's x; TMA's 16-byte aligned base and row stride), s
// float32 [m]: the decode kernels at M <= 16, on Hopper wgmma_big where gemm_fused takes it,
// fused_gemm_nt otherwise; group_size 0. workspace: linear_a8_workspace_floats floats (a
// split K's parts; null where that is 0, else the call takes fused_gemm_nt).
cudaError_t launch_linear_a8_fused(const void* xq, int64_t ldx, const uint8_t* repacked,
                                   const float* scale, const float* s, const void* bias, void* y,
                                   DType dtype, int64_t m, int64_t n, int64_t k, bool per_tensor,
                                   int num_sms, float* workspace, cudaStream_t stream);
int64_t linear_a8_workspace_floats(int64_t m, int64_t n, int64_t k, int num_sms);
// Whether launch_linear_a8_fused takes this call (k a multiple of 64): M <= 128, or M up to
// kLinearA8FloatMaxM where its kernel is wgmma_big and gemm_a8_wgmma_tiles(m, n) * 2 < num_sms
bool linear_a8_fused_takes(int64_t m, int64_t n, int64_t k, int num_sms);
// The kernel launch_linear_a8_fused runs for this call (one of gemm_fused_route's names).
const char* linear_a8_fused_route(int64_t m, int64_t n, int64_t k, int num_sms);

// Fused path (fused/). repacked: uint8 [ceil(n/32), ceil(k/64), 512], the layout
// common/layout.cuh describes; launch_repack writes it from the canonical packed [n, k/4].
cudaError_t launch_repack(const uint8_t* packed, uint8_t* out, int64_t n, int64_t k,
                          cudaStream_t stream);
// The inverse: repacked -> canonical packed uint8 [n, k/4] (k a multiple of 4).
cudaError_t launch_unrepack(const uint8_t* repacked, uint8_t* out, int64_t n, int64_t k,
                            cudaStream_t stream);
// Dense out[n, k] of dtype (half, bfloat16, float) straight from the repacked tiles, bit for
// bit what launch_dequantize makes from the canonical copy; group_size 0 or a multiple of 64.
cudaError_t launch_dequantize_repacked(const uint8_t* repacked, const float* scale, void* out,
                                       DType dtype, int64_t n, int64_t k, int64_t group_size,
                                       bool per_tensor, cudaStream_t stream);
// y[m, n] = x @ W^T (+ bias) straight from the repacked codes; dtype half or bfloat16;
// group_size 0 (channel/tensor scale) or a multiple of 64. num_sms sizes the grid.
// workspace: gemm_fused_workspace_floats(...) floats on the device (any contents), or nullptr
// when that is 0 (with nullptr a route that needs it falls back to one that does not).
cudaError_t launch_gemm_fused(const void* x, int64_t ldx, const uint8_t* repacked,
                              const float* scale, const void* bias, void* y, DType dtype,
                              int64_t m, int64_t n, int64_t k, int64_t group_size,
                              bool per_tensor, int num_sms, float* workspace,
                              cudaStream_t stream);
// The fp32 workspace launch_gemm_fused wants for this call on the current device (the
// split-K parts of the Hopper route), in floats; 0 for none.
int64_t gemm_fused_workspace_floats(int64_t m, int64_t n, int64_t k, int64_t group_size,
                                    int num_sms);
// The kernel launch_gemm_fused picks for this call on the current device ("decode",
// "fused_gemm", "fused_gemm_half", "fused_gemm_nt", "wgmma_rs", "wgmma_rs_splitk",
// "wgmma_big", "wgmma_big_splitk").
const char* gemm_fused_route(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms);
// The tile of the tensor-core routes (wgmma_rs, wgmma_big) for this call: tokens a block and
// the K split; 0 tokens for the other routes. persistent: wgmma_big runs its persistent kernel
// (one block an SM over the tiles).
void gemm_fused_plan(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms,
                     int* tokens, int* splits, bool* persistent);
// Whether this call takes wgmma_big (split or not), the one fused kernel that beats
// dequantize + cuBLAS above M = 128 (linear_fused then keeps the fused route past its max_m).
bool gemm_fused_takes_large_m(int64_t m, int64_t n, int64_t k, int64_t group_size, int num_sms);

// Per-token int8 activation quantization (act_quant.cu): for each row of x [m, k] (dtype,
// contiguous, any alignment), s[row] = 127 / max(max|x|, 1e-5) and q = clamp(rint(x * s),
// -128, 127) in float32, bit for bit ternary/ops.py's _quantize_act_int8_ref; q [m, k] (rows
// ldq >= k elements apart, columns past k left as they are) is int8 (q_int8) or of x's
// dtype, s float32 [m]. m = 0 launches nothing; k must be > 0.
cudaError_t launch_quantize_act_int8(const void* x, DType dtype, void* q, bool q_int8, float* s,
                                     int64_t m, int64_t k, int64_t ldq, cudaStream_t stream);
// The kernel launch_quantize_act_int8 takes for rows of k elements of dtype: "warp" (rows up to
// 2 KiB), "block" (up to 128 KiB, one read of x) or "block_two_pass" (longer rows, x read twice).
const char* quantize_act_int8_route(DType dtype, int64_t k);

}  // namespace ternary
