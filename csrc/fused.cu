// The fused ternary gemm: unpack, dequantize and multiply in one pass over a weight layout
// made for it at load time (repack), with no dense weight anywhere in memory.
//
// Layout ("repacked", uint8 [ceil(N/32), ceil(K/64), 512]): one 512-byte tile per 32 output
// channels x 64 inputs, 16 bytes per lane of a warp, so a warp reads a tile with one
// coalesced 16-byte load per lane and each lane gets exactly the codes of its mma.sync
// m16n8k16 B fragments (4 n8 fragments x 4 k16 steps). Inside lane (g = lane/4, t = lane%4)'s
// 16 bytes, 32-bit word w, pair j = 2f + r, half h: bits 16h + 2j hold the code of
//   n = 32 nt + 8 f + g,   k = 64 kt + 16 t + 4 w + 2 r + h.
// The k order is permuted inside a tile so that the same lane's A fragments (activations)
// are 16 consecutive elements of one x row: two 16-byte loads from L1, no shared memory.
// Codes outside [N, K] are 1 (w = 0). Decoding is LUT-free: (word >> 2j) & 0x00030003 puts
// two codes in the mantissas of a packed half2/bfloat162 whose exponent is set by OR-ing a
// magic number (1024 + c in fp16, 128 + c in bf16); one packed subtraction gives c - 1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels.h"

namespace ternary {
namespace {

constexpr int kTileN = 32;
constexpr int kTileK = 64;
constexpr int kTileBytes = 512;

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

template <typename T> struct Magic;
template <> struct Magic<__nv_bfloat16> {
  static constexpr uint32_t kOr = 0x43004300u;   // bf16 128.0 in both halves
  static constexpr uint32_t kSub = 0x43014301u;  // 129.0
};
template <> struct Magic<__half> {
  static constexpr uint32_t kOr = 0x64006400u;   // fp16 1024.0
  static constexpr uint32_t kSub = 0x64016401u;  // 1025.0
};

template <typename T> __device__ __forceinline__ uint32_t sub2(uint32_t a, uint32_t b);
template <> __device__ __forceinline__ uint32_t sub2<__nv_bfloat16>(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
template <> __device__ __forceinline__ uint32_t sub2<__half>(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

template <typename T, int J> __device__ __forceinline__ uint32_t decode_pair(uint32_t q) {
  return sub2<T>(((q >> (2 * J)) & 0x00030003u) | Magic<T>::kOr, Magic<T>::kSub);
}

template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], uint32_t a0, uint32_t a1,
                                                   uint32_t a2, uint32_t a3, uint32_t b0,
                                                   uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weights are read once: keep them out of L1 so the activations stay there.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// 16 consecutive elements x[row, k0 .. k0+15] as 8 packed pairs; zeros outside [m, k).
template <typename T>
__device__ __forceinline__ void load_x16(uint32_t (&out)[8], const T* __restrict__ x,
                                         int64_t ldx, int row, int m, int k0, int k, bool vec) {
  if (row >= m) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = 0;
    return;
  }
  const T* p = x + (int64_t)row * ldx + k0;
  if (vec && k0 + 16 <= k) {
    const uint4 v0 = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 v1 = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    out[0] = v0.x; out[1] = v0.y; out[2] = v0.z; out[3] = v0.w;
    out[4] = v1.x; out[5] = v1.y; out[6] = v1.z; out[7] = v1.w;
    return;
  }
  const unsigned short* ps = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = (k0 + 2 * i < k) ? ps[2 * i] : 0u;
    const uint32_t hi = (k0 + 2 * i + 1 < k) ? ps[2 * i + 1] : 0u;
    out[i] = lo | (hi << 16);
  }
}

// One block: 32 output channels x 16*MT rows of x. Its warps split the K tiles round-robin
// (U tiles in flight per warp), then sum their accumulators in a shared-memory tree (shared
// float atomics compile to CAS loops on sm_90: 8x slower end to end in the first version).
// Sizes fit in int (the launcher checks), offsets into x and the weight are 64-bit.
template <int MT> constexpr int min_blocks() { return MT <= 2 ? 2 : 1; }

template <typename T, int MT, int U, bool GROUP>
__global__ void __launch_bounds__(256, min_blocks<MT>())
fused_gemm_kernel(const T* __restrict__ x, int64_t ldx, const uint4* __restrict__ w,
                  const float* __restrict__ scale, const T* __restrict__ bias,
                  T* __restrict__ y, int m, int n, int k, int kt_count, int group_size,
                  int groups, bool per_tensor, bool vec_x) {
  extern __shared__ float red[];  // [nwarps / 2][16 * MT][32 lanes]
  constexpr int kAcc = MT * 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * 16 * MT;
  const int nt = blockIdx.y;

  float acc[MT][4][4];
#pragma unroll
  for (int a = 0; a < MT; ++a)
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][f][e] = 0.f;

  const uint4* wt = w + (int64_t)nt * kt_count * 32 + lane;
  for (int kt0 = warp; kt0 < kt_count; kt0 += nwarps * U) {
    uint4 q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kt = kt0 + u * nwarps;
      q[u] = kt < kt_count ? load_stream(wt + (int64_t)kt * 32) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kt = kt0 + u * nwarps;
      if (kt >= kt_count) break;  // uniform across the warp
      const int kseg = kt * kTileK + t * 16;
      uint32_t xa[MT][2][8];
#pragma unroll
      for (int a = 0; a < MT; ++a) {
        load_x16<T>(xa[a][0], x, ldx, m0 + a * 16 + g, m, kseg, k, vec_x);
        load_x16<T>(xa[a][1], x, ldx, m0 + a * 16 + 8 + g, m, kseg, k, vec_x);
      }
      float part[GROUP ? MT : 1][4][4];
      if (GROUP) {
#pragma unroll
        for (int a = 0; a < (GROUP ? MT : 1); ++a)
#pragma unroll
          for (int f = 0; f < 4; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[a][f][e] = 0.f;
      }
      const uint32_t qw[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
        uint32_t b[4][2];
        b[0][0] = decode_pair<T, 0>(qw[wi]);
        b[0][1] = decode_pair<T, 1>(qw[wi]);
        b[1][0] = decode_pair<T, 2>(qw[wi]);
        b[1][1] = decode_pair<T, 3>(qw[wi]);
        b[2][0] = decode_pair<T, 4>(qw[wi]);
        b[2][1] = decode_pair<T, 5>(qw[wi]);
        b[3][0] = decode_pair<T, 6>(qw[wi]);
        b[3][1] = decode_pair<T, 7>(qw[wi]);
#pragma unroll
        for (int a = 0; a < MT; ++a) {
#pragma unroll
          for (int f = 0; f < 4; ++f) {
            if (GROUP)
              mma<T>(part[GROUP ? a : 0][f], xa[a][0][2 * wi], xa[a][1][2 * wi],
                     xa[a][0][2 * wi + 1], xa[a][1][2 * wi + 1], b[f][0], b[f][1]);
            else
              mma<T>(acc[a][f], xa[a][0][2 * wi], xa[a][1][2 * wi], xa[a][0][2 * wi + 1],
                     xa[a][1][2 * wi + 1], b[f][0], b[f][1]);
          }
        }
      }
      if (GROUP) {
        // group_size is a multiple of 64, so a tile lies in one group.
        const int gi = kt * kTileK / group_size;
#pragma unroll
        for (int f = 0; f < 4; ++f) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = nt * kTileN + f * 8 + 2 * t + e;
            const float s = col < n ? __ldg(scale + (int64_t)col * groups + gi) : 0.f;
#pragma unroll
            for (int a = 0; a < MT; ++a) {
              acc[a][f][e] += part[GROUP ? a : 0][f][e] * s;
              acc[a][f][2 + e] += part[GROUP ? a : 0][f][2 + e] * s;
            }
          }
        }
      }
    }
  }
  // Tree sum over the warps (nwarps is a power of two); warp 0 ends with the total.
  for (int half = nwarps >> 1; half >= 1; half >>= 1) {
    if (warp >= half && warp < 2 * half) {
      float* dst = red + (warp - half) * kAcc * 32 + lane;
#pragma unroll
      for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int f = 0; f < 4; ++f)
#pragma unroll
          for (int e = 0; e < 4; ++e) dst[((a * 4 + f) * 4 + e) * 32] = acc[a][f][e];
    }
    __syncthreads();
    if (warp < half) {
      const float* src = red + warp * kAcc * 32 + lane;
#pragma unroll
      for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int f = 0; f < 4; ++f)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[a][f][e] += src[((a * 4 + f) * 4 + e) * 32];
    }
    __syncthreads();
  }
  if (warp != 0) return;
#pragma unroll
  for (int f = 0; f < 4; ++f) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = nt * kTileN + f * 8 + 2 * t + e;
      if (col >= n) continue;
      float s = 1.f;
      if (!GROUP) s = per_tensor ? scale[0] : scale[col];
      const float b = bias ? to_float(bias[col]) : 0.f;
#pragma unroll
      for (int a = 0; a < MT; ++a) {
        const int row = m0 + a * 16 + g;
        if (row < m) y[(int64_t)row * n + col] = from_float<T>(acc[a][f][e] * s + b);
        if (row + 8 < m) y[(int64_t)(row + 8) * n + col] = from_float<T>(acc[a][f][2 + e] * s + b);
      }
    }
  }
}

template <typename T, int MT, int U, bool GROUP>
cudaError_t launch_fused(const void* x, int64_t ldx, const uint8_t* repacked, const float* scale,
                         const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                         int64_t group_size, bool per_tensor, int num_sms, cudaStream_t stream) {
  // int arithmetic inside the kernel: every index below 2^31 (row * ldx is 64-bit there).
  if (m > INT32_MAX - 64 || n > INT32_MAX - 64 || k > INT32_MAX - 64 ||
      (int64_t)m * n > INT64_MAX / 2)
    return cudaErrorInvalidValue;
  const int kt_count = (int)((k + kTileK - 1) / kTileK);
  const int64_t nt_count = (n + kTileN - 1) / kTileN;
  const int64_t mb = (m + 16 * MT - 1) / (16 * MT);
  if (nt_count > 65535 || mb > INT32_MAX / 2) return cudaErrorInvalidConfiguration;
  // Enough warps in flight to cover memory latency, but at least 4 K tiles per warp so the
  // reduction stays small next to the streaming.
  int nwarps = 2;
  while (nwarps < 8 && mb * nt_count * nwarps < (int64_t)num_sms * 32 &&
         kt_count >= nwarps * 2 * 4)
    nwarps *= 2;
  const bool vec_x = (ldx % 8 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0);
  const int64_t groups = group_size ? (k + group_size - 1) / group_size : 1;
  const size_t smem = sizeof(float) * (nwarps / 2) * 16 * MT * 32;
  const dim3 grid((unsigned)mb, (unsigned)nt_count);
  fused_gemm_kernel<T, MT, U, GROUP><<<grid, nwarps * 32, smem, stream>>>(
      (const T*)x, ldx, reinterpret_cast<const uint4*>(repacked), scale, (const T*)bias, (T*)y,
      (int)m, (int)n, (int)k, kt_count, (int)group_size, (int)groups, per_tensor, vec_x);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_fused_typed(const void* x, int64_t ldx, const uint8_t* repacked,
                               const float* scale, const void* bias, void* y, int64_t m,
                               int64_t n, int64_t k, int64_t group_size, bool per_tensor,
                               int num_sms, cudaStream_t stream) {
  if (group_size) {
    if (m <= 16)
      return launch_fused<T, 1, 8, true>(x, ldx, repacked, scale, bias, y, m, n, k, group_size,
                                         per_tensor, num_sms, stream);
    return launch_fused<T, 2, 2, true>(x, ldx, repacked, scale, bias, y, m, n, k, group_size,
                                       per_tensor, num_sms, stream);
  }
  if (m <= 16)
    return launch_fused<T, 1, 8, false>(x, ldx, repacked, scale, bias, y, m, n, k, group_size,
                                        per_tensor, num_sms, stream);
  if (m <= 32)
    return launch_fused<T, 2, 4, false>(x, ldx, repacked, scale, bias, y, m, n, k, group_size,
                                        per_tensor, num_sms, stream);
  return launch_fused<T, 4, 2, false>(x, ldx, repacked, scale, bias, y, m, n, k, group_size,
                                      per_tensor, num_sms, stream);
}

}  // namespace

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

cudaError_t launch_gemm_fused(const void* x, int64_t ldx, const uint8_t* repacked,
                              const float* scale, const void* bias, void* y, DType dtype,
                              int64_t m, int64_t n, int64_t k, int64_t group_size,
                              bool per_tensor, int num_sms, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (group_size % kTileK) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kHalf:
      return launch_fused_typed<__half>(x, ldx, repacked, scale, bias, y, m, n, k, group_size,
                                        per_tensor, num_sms, stream);
    case DType::kBFloat16:
      return launch_fused_typed<__nv_bfloat16>(x, ldx, repacked, scale, bias, y, m, n, k,
                                               group_size, per_tensor, num_sms, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ternary
