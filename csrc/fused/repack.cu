#define TERNARY_TU repack_cu  // this file's namespace (common/tu.cuh)
// The load-time layout transform of the fused kernels (common/layout.cuh describes the
// layout): repack from the canonical packed weight, its inverse, and the dense dequantize
// straight from the tiles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/layout.cuh"
#include "dtype.cuh"
#include "kernels.h"

namespace ternary {
inline namespace TERNARY_TU {

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
// [0, 16) are in lane (g, t)'s 16 bytes of tile (nt, kt) (common/layout.cuh); the four f of a
// lane share those bytes, so a tile is read from DRAM once and from L2 up to four times.
// (A warp a tile, each lane writing 8 rows' worth of 32-byte pieces, is 2.8x slower than the
// canonical dequantize.) The arithmetic per element is
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

}  // namespace TERNARY_TU

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

}  // namespace ternary
