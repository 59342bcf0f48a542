// Per-token int8 activation quantization, ternary::quantize_act_int8 (docs/formats.md,
// Activations: int8_per_token). Per row of x [m, k], in float32 (x upcast from its dtype):
//   amax = max(max|x|, 1e-5f);  s = (1 / amax) * 127;  x_q = clamp(rint(x * s), -128, 127)
// bit for bit what _quantize_act_int8_ref (ternary/ops.py) computes with PyTorch, on every
// input: the max is exact; 1 / amax, the * 127 and x * s are single IEEE float32 operations
// (__frcp_rn, __fmul_rn: correctly rounded whatever the nvcc flags, and never contracted into
// an FMA); rint rounds half to even like torch.round. NaN propagates as in torch (a row holding
// a NaN gets s = NaN; its float x_q are NaN, its int8 x_q 0, which is also what PyTorch's CPU
// float -> int8 conversion gives); an infinite amax gives s = 0.
//
// One pass over x: each row is read once into registers (16-byte loads where the row is
// 16-byte aligned, the unaligned head and the tail of the row as scalars), the group that owns
// the row reduces the max, then writes x_q from the registers. A warp owns a row of up to
// 2 KiB (8 rows a block), a block of up to 1024 threads a row of up to 128 KiB; longer rows
// (float32 K > 32768, fp16/bf16 K > 65536) take a kernel that reads the row twice (the second
// read mostly from L2).
#define TERNARY_TU act_quant_cu  // this file's namespace (common/tu.cuh)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/launch.cuh"
#include "dtype.cuh"
#include "kernels.h"

namespace ternary {
// Named, not anonymous: cudafe++ names an anonymous namespace after a hash of the file's
// path, which would put the checkout path into every kernel symbol (docs/build.md).
inline namespace act_quant_cu {

constexpr float kEps = 1e-5f;   // torch's clamp(min=1e-5) on a float32 tensor: float(1e-5)
constexpr float kQmax = 127.f;

template <typename T> constexpr int kVec = 16 / (int)sizeof(T);  // elements per 16 bytes

// |f| as its bit pattern: non-negative floats order like their bits, and a NaN (sign
// cleared) compares above +inf, so an unsigned max propagates NaN as torch.amax does.
__device__ __forceinline__ uint32_t abs_bits(float f) { return __float_as_uint(f) & 0x7fffffffu; }

__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, v);
#else
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
#endif
}

__device__ __forceinline__ float scale_of(uint32_t amax_bits) {
  float amax = __uint_as_float(amax_bits);
  amax = amax < kEps ? kEps : amax;  // (a NaN stays NaN, as with torch.clamp)
  return __fmul_rn(__frcp_rn(amax), kQmax);
}

template <typename OutT> struct Quant {  // float outputs: half, bfloat16, float
  __device__ __forceinline__ static OutT of(float x, float s) {
    float r = rintf(__fmul_rn(x, s));  // keeps -0.0 and NaN, as torch.round
    r = r < -128.f ? -128.f : (r > 127.f ? 127.f : r);  // NaN passes, as torch.clamp
    return from_float<OutT>(r);  // integers up to 128 are exact in every float dtype
  }
};
template <> struct Quant<int8_t> {
  __device__ __forceinline__ static int8_t of(float x, float s) {
    const int r = __float2int_rn(__fmul_rn(x, s));  // half to even; NaN -> 0
    return (int8_t)max(-128, min(127, r));
  }
};

// 16 bytes of x as floats
template <typename T> struct Chunk {
  union {
    uint4 raw;
    T e[kVec<T>];
  };
  __device__ __forceinline__ float at(int j) const { return to_float(e[j]); }
  __device__ __forceinline__ uint32_t absmax() const {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) m = max(m, abs_bits(at(j)));
    return m;
  }
};

// An output element's bits, zero-extended.
__device__ __forceinline__ uint32_t bits_of(int8_t v) { return (uint8_t)v; }
__device__ __forceinline__ uint32_t bits_of(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint32_t bits_of(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ uint32_t bits_of(float v) { return __float_as_uint(v); }

template <int WORDS> struct Words;  // one vector store of WORDS 32-bit words
template <> struct Words<4> {
  __device__ __forceinline__ static void store(void* p, const uint32_t (&w)[4]) {
    // (a plain uint4 store of these words comes out of NVVM as four 32-bit stores)
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
  }
};
template <> struct Words<2> {
  __device__ __forceinline__ static void store(void* p, const uint32_t (&w)[2]) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  }
};
template <> struct Words<1> {
  __device__ __forceinline__ static void store(void* p, const uint32_t (&w)[1]) {
    *reinterpret_cast<uint32_t*>(p) = w[0];
  }
};

// The chunk's V outputs at `out`: one 4/8/16-byte store when `vec` (out aligned to that),
// else V scalar stores.
template <typename T, typename OutT>
__device__ __forceinline__ void store_chunk(const Chunk<T>& c, float s, OutT* out, bool vec) {
  constexpr int V = kVec<T>, kWords = V * (int)sizeof(OutT) / 4;
  OutT e[V];
#pragma unroll
  for (int j = 0; j < V; ++j) e[j] = Quant<OutT>::of(c.at(j), s);
  if (vec) {
    uint32_t w[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
#pragma unroll
    for (int j = 0; j < V; ++j)
      w[j * sizeof(OutT) / 4] |= bits_of(e[j]) << (8 * ((j * sizeof(OutT)) % 4));
    Words<kWords>::store(out, w);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = e[j];
  }
}

// Where row `xr` of k elements splits into an unaligned scalar head, 16-byte chunks and a
// scalar tail (head + tail < 2 * kVec elements).
template <typename T> struct RowSplit {
  int64_t head, nvec, tail0;
  int nscalar;
  __device__ __forceinline__ RowSplit(const T* xr, int64_t k) {
    constexpr int V = kVec<T>;
    const int mis = (int)((reinterpret_cast<uintptr_t>(xr) & 15) / sizeof(T));
    head = mis ? (V - mis < k ? V - mis : k) : 0;
    nvec = (k - head) / V;
    tail0 = head + nvec * V;
    nscalar = (int)(head + (k - tail0));
  }
  // the row index of scalar i (i < nscalar)
  __device__ __forceinline__ int64_t scalar_index(int i) const {
    return i < head ? i : tail0 + (i - head);
  }
};

// The max over the row's group: a warp (WARP) or the whole block. red: 32 words of shared
// memory, alternated between consecutive rows so one barrier a row suffices.
template <bool WARP>
__device__ __forceinline__ uint32_t group_max(uint32_t v, uint32_t* red) {
  v = warp_max(v);
  if (WARP) return v;
  const int lane = threadIdx.x & 31;
  if (lane == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? red[lane] : 0u;
  return warp_max(v);
}

// This thread's scalar element of row xr (the unaligned head or the tail), where it has one:
// its value into xs and its |x| into mx; returns its index in the row, or -1 (xs = 0).
template <typename T>
__device__ __forceinline__ int64_t scalar_of(const T* xr, const RowSplit<T>& sp, int tid,
                                             float& xs, uint32_t& mx) {
  int64_t at = -1;
  xs = 0.f;
  if (tid < sp.nscalar) {
    at = sp.scalar_index(tid);
    xs = to_float(xr[at]);
    mx = max(mx, abs_bits(xs));
  }
  return at;
}

// Rows held in registers: VPT chunks a thread. WARP: a warp a row, blockDim.x / 32 rows a
// block; else a block a row. Rows beyond the grid are taken grid-stride.
template <typename T, typename OutT, int VPT, bool WARP>
__global__ void __launch_bounds__(1024)
act_quant_kernel(const T* __restrict__ x, OutT* __restrict__ q, float* __restrict__ s,
                 int64_t m, int64_t k, int64_t ldq) {
  // the GEMM launched after this (ternary::linear_a8's, programmatic) may start its weight
  // stream now; it waits for this grid's x_q and s (pdl_wait) before it reads them
  pdl_trigger();
  __shared__ uint32_t red[2][32];
  const int tid = WARP ? (threadIdx.x & 31) : threadIdx.x;
  const int nthr = WARP ? 32 : blockDim.x;
  const int64_t rows_a_block = WARP ? (blockDim.x >> 5) : 1;
  const int64_t stride = (int64_t)gridDim.x * rows_a_block;
  int parity = 0;
  for (int64_t row = (int64_t)blockIdx.x * rows_a_block + (WARP ? threadIdx.x >> 5 : 0);
       row < m; row += stride, parity ^= 1) {
    const T* xr = x + row * k;
    OutT* qr = q + row * ldq;
    const RowSplit<T> sp(xr, k);
    const int nvec = (int)sp.nvec;  // <= VPT * nthr (the launcher's choice)
    const uint4* xv = reinterpret_cast<const uint4*>(xr + sp.head);
    Chunk<T> c[VPT];
    uint32_t mx = 0;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int j = tid + i * nthr;
      if (j < nvec) c[i].raw = xv[j];
    }
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      if (tid + i * nthr < nvec) mx = max(mx, c[i].absmax());
    float xs;
    const int64_t xs_at = scalar_of(xr, sp, tid, xs, mx);
    const float scale = scale_of(group_max<WARP>(mx, red[parity]));
    if (tid == 0) s[row] = scale;
    OutT* qv = qr + sp.head;
    const bool vec = (reinterpret_cast<uintptr_t>(qv) % (kVec<T> * sizeof(OutT))) == 0;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int j = tid + i * nthr;
      if (j < nvec) store_chunk(c[i], scale, qv + (int64_t)j * kVec<T>, vec);
    }
    if (xs_at >= 0) qr[xs_at] = Quant<OutT>::of(xs, scale);
  }
}

// Rows longer than the registers of a block hold: a block of kLongThreads a row, the row read
// twice.
constexpr int kLongThreads = 512;  // (at 1024, CUDA 13's ptxas spills 4 bytes on sm_90a/100)

template <typename T, typename OutT>
__global__ void __launch_bounds__(kLongThreads)
act_quant_long_kernel(const T* __restrict__ x, OutT* __restrict__ q, float* __restrict__ s,
                      int64_t m, int64_t k, int64_t ldq) {
  pdl_trigger();  // (as act_quant_kernel)
  __shared__ uint32_t red[2][32];
  const int tid = threadIdx.x, nthr = blockDim.x;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < m; row += gridDim.x, parity ^= 1) {
    const T* xr = x + row * k;
    OutT* qr = q + row * ldq;
    const RowSplit<T> sp(xr, k);
    const uint4* xv = reinterpret_cast<const uint4*>(xr + sp.head);
    uint32_t mx = 0;
#pragma unroll 4
    for (int64_t j = tid; j < sp.nvec; j += nthr) {
      Chunk<T> c;
      c.raw = xv[j];
      mx = max(mx, c.absmax());
    }
    float xs;
    const int64_t xs_at = scalar_of(xr, sp, tid, xs, mx);
    const float scale = scale_of(group_max<false>(mx, red[parity]));
    if (tid == 0) s[row] = scale;
    OutT* qv = qr + sp.head;
    const bool vec = (reinterpret_cast<uintptr_t>(qv) % (kVec<T> * sizeof(OutT))) == 0;
#pragma unroll 4
    for (int64_t j = tid; j < sp.nvec; j += nthr) {
      Chunk<T> c;
      c.raw = xv[j];
      store_chunk(c, scale, qv + j * kVec<T>, vec);
    }
    if (xs_at >= 0) qr[xs_at] = Quant<OutT>::of(xs, scale);
  }
}

constexpr int kWarpRowsABlock = 8;
// At most this many rows in flight (blocks of the block kernels; 8 rows a block for the warp
// kernel); a block takes further rows grid-stride. 8192 rows are several waves on any GPU,
// and the cap puts the row loop and its alternating shared words under the tests (M > 8192).
constexpr int64_t kMaxGrid = 8192;

unsigned grid_of(int64_t blocks) { return (unsigned)(blocks < kMaxGrid ? blocks : kMaxGrid); }
// the warp kernel: at most kMaxGrid rows at once (blocks of kWarpRowsABlock rows)
unsigned warp_grid_of(int64_t m) {
  const int64_t blocks = (m + kWarpRowsABlock - 1) / kWarpRowsABlock;
  const int64_t cap = kMaxGrid / kWarpRowsABlock;
  return (unsigned)(blocks < cap ? blocks : cap);
}
int round_warps(int64_t threads) { return (int)((threads + 31) / 32 * 32); }

template <typename T, typename OutT, int VPT>
void launch_block(const T* x, OutT* q, float* s, int64_t m, int64_t k, int64_t ldq,
                  int64_t nvec, cudaStream_t stream) {
  const int threads = round_warps((nvec + VPT - 1) / VPT);
  act_quant_kernel<T, OutT, VPT, false><<<grid_of(m), threads, 0, stream>>>(x, q, s, m, k, ldq);
}

template <typename T, typename OutT, int VPT>
void launch_warp(const T* x, OutT* q, float* s, int64_t m, int64_t k, int64_t ldq,
                 cudaStream_t stream) {
  act_quant_kernel<T, OutT, VPT, true><<<warp_grid_of(m), kWarpRowsABlock * 32, 0, stream>>>(
      x, q, s, m, k, ldq);
}

template <typename T, typename OutT>
void launch_typed(const void* xp, void* qp, float* s, int64_t m, int64_t k, int64_t ldq,
                  cudaStream_t stream) {
  const T* x = static_cast<const T*>(xp);
  OutT* q = static_cast<OutT*>(qp);
  const int64_t nvec = k / kVec<T>;  // a row holds at most this many aligned chunks
  if (nvec <= 32) launch_warp<T, OutT, 1>(x, q, s, m, k, ldq, stream);
  else if (nvec <= 64) launch_warp<T, OutT, 2>(x, q, s, m, k, ldq, stream);
  else if (nvec <= 128) launch_warp<T, OutT, 4>(x, q, s, m, k, ldq, stream);
  else if (nvec <= 512) launch_block<T, OutT, 2>(x, q, s, m, k, ldq, nvec, stream);
  else if (nvec <= 4096) launch_block<T, OutT, 4>(x, q, s, m, k, ldq, nvec, stream);
  else if (nvec <= 8192) launch_block<T, OutT, 8>(x, q, s, m, k, ldq, nvec, stream);
  else
    act_quant_long_kernel<T, OutT><<<grid_of(m), kLongThreads, 0, stream>>>(x, q, s, m, k, ldq);
}

template <typename T>
void launch_out(const void* x, void* q, bool q_int8, float* s, int64_t m, int64_t k,
                int64_t ldq, cudaStream_t stream) {
  if (q_int8) launch_typed<T, int8_t>(x, q, s, m, k, ldq, stream);
  else launch_typed<T, T>(x, q, s, m, k, ldq, stream);
}

}  // namespace act_quant_cu

const char* quantize_act_int8_route(DType dtype, int64_t k) {
  const int64_t nvec = k / (dtype == DType::kFloat ? 4 : 8);
  if (nvec <= 128) return "warp";
  if (nvec <= 8192) return "block";
  return "block_two_pass";
}

cudaError_t launch_quantize_act_int8(const void* x, DType dtype, void* q, bool q_int8, float* s,
                                     int64_t m, int64_t k, int64_t ldq, cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  if (m < 0 || k <= 0 || ldq < k) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kHalf: launch_out<__half>(x, q, q_int8, s, m, k, ldq, stream); break;
    case DType::kBFloat16: launch_out<__nv_bfloat16>(x, q, q_int8, s, m, k, ldq, stream); break;
    case DType::kFloat: launch_out<float>(x, q, q_int8, s, m, k, ldq, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace ternary
