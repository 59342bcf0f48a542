// Launchers of the CUDA kernels in *.cu. Plain C++ types only: the .cu files include
// cuda_runtime.h and nothing of ATen, which keeps nvcc 3.5x faster (DESIGN.md, Build speed).
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

}  // namespace ternary
