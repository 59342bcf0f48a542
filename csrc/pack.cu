// Elementwise pack/unpack/dequantize of the canonical layout (docs/formats.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dtype.cuh"
#include "kernels.h"

namespace ternary {
// Named, not anonymous: cudafe++ names an anonymous namespace after a hash of the
// checkout path, which would put the path into every kernel's symbol. Inline, so the
// names below read as before.
inline namespace pack_cu {

constexpr int kThreads = 256;

__global__ void pack_kernel(const int8_t* __restrict__ codes, uint8_t* __restrict__ packed,
                            int64_t bytes) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < bytes;
       i += (int64_t)gridDim.x * blockDim.x) {
    const char4 c = reinterpret_cast<const char4*>(codes)[i];
    packed[i] = (uint8_t)((c.x + 1) | ((c.y + 1) << 2) | ((c.z + 1) << 4) | ((c.w + 1) << 6));
  }
}

__global__ void unpack_kernel(const uint8_t* __restrict__ packed, int8_t* __restrict__ codes,
                              int64_t bytes) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < bytes;
       i += (int64_t)gridDim.x * blockDim.x) {
    const uint8_t b = packed[i];
    reinterpret_cast<char4*>(codes)[i] =
        make_char4((b & 3) - 1, ((b >> 2) & 3) - 1, ((b >> 4) & 3) - 1, ((b >> 6) & 3) - 1);
  }
}

template <typename T>
__global__ void dequantize_kernel(const uint8_t* __restrict__ packed, const float* __restrict__ scale,
                                  T* __restrict__ out, int64_t n, int64_t k, int64_t group_size,
                                  bool per_tensor) {
  const int64_t kb = k / 4, bytes = n * kb;
  const int64_t groups = group_size ? (k + group_size - 1) / group_size : 1;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < bytes;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / kb, col = (i % kb) * 4;
    const uint8_t b = packed[i];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float s;
      if (per_tensor) s = scale[0];
      else if (group_size) s = scale[row * groups + (col + j) / group_size];
      else s = scale[row];
      out[row * k + col + j] = from_float<T>((float)(((b >> (2 * j)) & 3) - 1) * s);
    }
  }
}

// The cuBLAS path's dequantize writes 2 bytes per weight; at one byte in per 8 out it is
// store-bound, so each thread turns 4 packed bytes (16 weights) into 16-byte stores.
// Needs K % 16 == 0 and a 16-byte aligned output; the launcher falls back otherwise.
template <typename T>
__global__ void dequantize_vec_kernel(const uint32_t* __restrict__ packed,
                                      const float* __restrict__ scale, uint4* __restrict__ out,
                                      int64_t n, int64_t k, int64_t group_size,
                                      bool per_tensor) {
  const int64_t words_per_row = k / 16, words = n * words_per_row;
  const int64_t groups = group_size ? (k + group_size - 1) / group_size : 1;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < words;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / words_per_row, col0 = (i % words_per_row) * 16;
    const uint32_t q = __ldg(packed + i);
    const float row_scale = per_tensor ? scale[0] : (group_size ? 0.f : scale[row]);
    union {
      T e[16];
      uint4 v[sizeof(T)];
    } u;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float s = group_size ? __ldg(scale + row * groups + (col0 + j) / group_size) : row_scale;
      u.e[j] = from_float<T>((float)((int)((q >> (2 * j)) & 3u) - 1) * s);
    }
#pragma unroll
    for (int v = 0; v < (int)sizeof(T); ++v) out[i * sizeof(T) + v] = u.v[v];
  }
}

int grid_for(int64_t items) {
  int64_t blocks = (items + kThreads - 1) / kThreads;
  return (int)(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

}  // namespace pack_cu

cudaError_t launch_pack(const int8_t* codes, uint8_t* packed, int64_t n, int64_t k,
                        cudaStream_t stream) {
  const int64_t bytes = n * (k / 4);
  if (bytes == 0) return cudaSuccess;
  pack_kernel<<<grid_for(bytes), kThreads, 0, stream>>>(codes, packed, bytes);
  return cudaGetLastError();
}

cudaError_t launch_unpack(const uint8_t* packed, int8_t* codes, int64_t n, int64_t k,
                          cudaStream_t stream) {
  const int64_t bytes = n * (k / 4);
  if (bytes == 0) return cudaSuccess;
  unpack_kernel<<<grid_for(bytes), kThreads, 0, stream>>>(packed, codes, bytes);
  return cudaGetLastError();
}

cudaError_t launch_dequantize(const uint8_t* packed, const float* scale, void* out, DType dtype,
                              int64_t n, int64_t k, int64_t group_size, bool per_tensor,
                              cudaStream_t stream) {
  const int64_t bytes = n * (k / 4);
  if (bytes == 0) return cudaSuccess;
  if (k % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(packed) % 4 == 0) {
    const int64_t words = n * (k / 16);
    const int grid = grid_for(words);
    const uint32_t* pw = reinterpret_cast<const uint32_t*>(packed);
    uint4* o = reinterpret_cast<uint4*>(out);
    switch (dtype) {
      case DType::kHalf:
        dequantize_vec_kernel<__half><<<grid, kThreads, 0, stream>>>(pw, scale, o, n, k, group_size, per_tensor);
        break;
      case DType::kBFloat16:
        dequantize_vec_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(pw, scale, o, n, k, group_size, per_tensor);
        break;
      case DType::kFloat:
        dequantize_vec_kernel<float><<<grid, kThreads, 0, stream>>>(pw, scale, o, n, k, group_size, per_tensor);
        break;
    }
    return cudaGetLastError();
  }
  const int grid = grid_for(bytes);
  switch (dtype) {
    case DType::kHalf:
      dequantize_kernel<<<grid, kThreads, 0, stream>>>(packed, scale, (__half*)out, n, k, group_size, per_tensor);
      break;
    case DType::kBFloat16:
      dequantize_kernel<<<grid, kThreads, 0, stream>>>(packed, scale, (__nv_bfloat16*)out, n, k, group_size, per_tensor);
      break;
    case DType::kFloat:
      dequantize_kernel<<<grid, kThreads, 0, stream>>>(packed, scale, (float*)out, n, k, group_size, per_tensor);
      break;
  }
  return cudaGetLastError();
}

}  // namespace ternary
