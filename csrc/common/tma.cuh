// TMA tensor maps (host side) for the kernels that load x by cp.async.bulk.tensor.
#pragma once

#include "common/tu.cuh"
#include <cuda.h>  // CUtensorMap (the type only: the encoder comes from the runtime)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common/layout.cuh"

namespace ternary {
inline namespace TERNARY_TU {

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

}  // namespace TERNARY_TU
}  // namespace ternary
