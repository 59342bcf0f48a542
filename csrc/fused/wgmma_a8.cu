#define TERNARY_TU wgmma_a8_cu  // this file's namespace (common/tu.cuh)
// gemm_a8_repacked's large-M kernel on Hopper (sm_90a): W1.58A8 on the int8 tensor cores by
// wgmma, from the fused kernels' repacked tiles (common/layout.cuh), with the int32 sums and
// gemm_a8's float32 epilogue (docs/kernels.md, "int8 activations").
//
// The weights are wgmma's A operand, decoded in registers to their codes c = w + 1 in
// {0, 1, 2} as u8; x_q is B (s8) from shared memory, so D = sum c * x_q, and the epilogue
// takes away the row sum of x_q (sum w * x_q = sum c * x_q - sum x_q; exact in int32).
// A lane's 16 bytes of a 64-wide repacked tile hold its 4 channels 8 f + g at k 16 t + [0, 16)
// (word w: k 16 t + 4 w + 2 r + h). wgmma's A fragment wants k 4 t + [0, 4) and 16 + 4 t + [0, 4)
// of each k32 step instead, so x_q is written in a k order of its own (a8_permute_kernel):
// inside every 64-wide tile, logical position L = 32 s + 16 hh + 4 t + j holds physical
// k = 16 t + 4 (2 s + hh) + 2 (j & 1) + (j >> 1). Then a lane's register for (step s, half
// hh, row f) is word 2 s + hh's four codes of f, one byte each, with no data from other lanes.
//
// A block takes 128 tokens x 256 channels: two consumer warpgroups of 128 channels (4 warps,
// one 32-channel repacked tile each: the tile's f = 0, 1 are the warp's rows of the first
// m64 block, f = 2, 3 those of the second), one producer thread that moves x_q in 128-wide
// k stages by TMA (128-byte rows, the 128-byte swizzle wgmma reads) into a ring of
// kA8Stages. Each consumer thread cp.asyncs its own 16 bytes of every 64-wide weight tile
// (a ring kA8Raw deep). The output tile leaves through shared memory.
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/async.cuh"
#include "common/layout.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dtype.cuh"
#include "kernels.h"

namespace ternary {
inline namespace TERNARY_TU {

constexpr int kA8Rows = 128;      // tokens a tile
constexpr int kA8Cols = 256;      // channels a tile
constexpr int kA8K = 128;         // k a stage: x_q rows of 128 bytes
constexpr int kA8Stages = 6;
constexpr int kA8Raw = 8;         // 64-wide weight pieces in flight a thread
constexpr int kA8Consumers = 256;

// x_q [m, k] (rows ldq bytes apart) -> xp [m, kp] in the permuted k order above, zeros past
// k, and rsum[m] = the row sums. A block a row, 128 threads, a thread a 16-byte piece.
__global__ void __launch_bounds__(128)
a8_permute_kernel(const int8_t* __restrict__ xq, int64_t ldq, int64_t k, int8_t* __restrict__ xp,
                  int64_t kp, int32_t* __restrict__ rsum, int64_t m) {
  __shared__ int red[4];
  const bool vec = ldq % 16 == 0 && (reinterpret_cast<uintptr_t>(xq) & 15) == 0;
  for (int64_t row = blockIdx.x; row < m; row += gridDim.x) {
    const int8_t* xr = xq + row * ldq;
    int8_t* pr = xp + row * kp;
    int sum = 0;
    for (int64_t c = threadIdx.x; c < kp / 16; c += blockDim.x) {
      const int64_t k0 = c * 16;
      uint32_t wd[4];
      if (vec && k0 + 16 <= k) {
        const uint4 q = *reinterpret_cast<const uint4*>(xr + k0);
        wd[0] = q.x, wd[1] = q.y, wd[2] = q.z, wd[3] = q.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t v = 0;
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int64_t kk = k0 + 4 * i + b;
            if (kk < k) v |= (uint32_t)(uint8_t)xr[kk] << (8 * b);
          }
          wd[i] = v;
        }
      }
      const int t = (int)(c & 3);
      int8_t* tile = pr + (c >> 2) * 64 + 4 * t;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sum = __dp4a((int)wd[i], 0x01010101, sum);
        // physical offsets 0, 1, 2, 3 of the word go to bytes j = 0, 2, 1, 3
        *reinterpret_cast<uint32_t*>(tile + 32 * (i >> 1) + 16 * (i & 1)) =
            __byte_perm(wd[i], 0, 0x3120);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x == 0) rsum[row] = red[0] + red[1] + red[2] + red[3];
    __syncthreads();
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma m64n128k32, A u8 from registers (the codes), B s8 from shared memory, D += A B in int32
__device__ __forceinline__ void wgmma_a8(int (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
      "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
      "%55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]),
        "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]),
        "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]),
        "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]),
        "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]),
        "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]),
        "+r"(d[62]), "+r"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// A fragments of one 64-wide k tile from the lane's 16 bytes: a[s][mb] for k32 step s and
// m64 block mb (rows f = 2 mb, 2 mb + 1). Row f's codes of word w, one byte each in the order
// (r, h) = (0, 0), (1, 0), (0, 1), (1, 1): v = w >> 4 f holds them at bits 0-1, 2-3, 16-17,
// 18-19.
template <int F> __device__ __forceinline__ uint32_t a8_codes(uint32_t word) {
  const uint32_t v = word >> (4 * F);
  const uint32_t u = F < 2 ? word << (6 - 4 * F) : word >> (4 * F - 6);  // v << 6
  return lop3_and_or(v, 0x00030003u, u & 0x03000300u);
}
__device__ __forceinline__ void a8_decode(const uint4& q, uint32_t (&a)[2][2][4]) {
  const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    a[s][0][0] = a8_codes<0>(wd[2 * s]);
    a[s][0][1] = a8_codes<1>(wd[2 * s]);
    a[s][0][2] = a8_codes<0>(wd[2 * s + 1]);
    a[s][0][3] = a8_codes<1>(wd[2 * s + 1]);
    a[s][1][0] = a8_codes<2>(wd[2 * s]);
    a[s][1][1] = a8_codes<3>(wd[2 * s]);
    a[s][1][2] = a8_codes<2>(wd[2 * s + 1]);
    a[s][1][3] = a8_codes<3>(wd[2 * s + 1]);
  }
}
__device__ __forceinline__ void a8_pin(uint32_t (&a)[2][2][4]) {
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[s][b][i])::"memory");
}
__device__ __forceinline__ void a8_pin(int (&d)[2][64]) {
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+r"(d[b][i])::"memory");
}
#endif

template <typename OutT> __device__ __forceinline__ OutT a8_out(int v, float sc, float s, float b) {
  if constexpr (std::is_same_v<OutT, int32_t>) {
    return v;
  } else {
    // gemm_a8's order (ternary.ops._gemm_a8_ref): sum * scale, / s, + bias, rounded once
    return from_float<OutT>((float)v * sc / s + b);
  }
}

// One tile a block: channel block tile % nb (the weights of a wave stay in L2 while x_q
// streams), token block tile / nb.
template <typename OutT>
__global__ void __launch_bounds__(384, 1)
a8_wgmma_kernel(const uint4* __restrict__ w, const float* __restrict__ s,
                const int32_t* __restrict__ rsum, const float* __restrict__ scale,
                const OutT* __restrict__ bias, OutT* __restrict__ y, int m, int n, int kt_total,
                int nt_count, bool per_tensor, int nb, const __grid_constant__ CUtensorMap xmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kA8Stages, kX = kA8Rows * kA8K, kC = kA8Consumers, kRR = kA8Raw;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (sraw + 1023) & ~1023u;  // the 128-byte swizzle repeats every 1024
  uint8_t* const sbase = smem_raw + (base - sraw);
  const uint32_t raw0 = base + S * kX, bar0 = raw0 + kRR * kC * 16, lo0 = wg_desc_lo(base);
  auto full = [&](int st) { return bar0 + 8u * st; };
  auto empty = [&](int st) { return bar0 + 8u * (S + st); };
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int cblk = (int)blockIdx.x % nb, rblk = (int)blockIdx.x / nb;
  const int m0 = rblk * kA8Rows, c0 = cblk * kA8Cols;
  const int stages = (kt_total + 1) / 2;  // 128-wide k stages (the last may be half x_q padding)
  if (tid == 0) {
    for (int st = 0; st < S; ++st) {
      mbar_init(full(st), 1);
      mbar_init(empty(st), kC);
    }
  }
  __syncthreads();

  if (wg == 2) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    if (tid != kC) return;
    for (int kt = 0; kt < stages; ++kt) {
      const int st = kt % S;
      if (kt >= S) mbar_wait(empty(st), ((kt / S) + 1) & 1);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(full(st)),
                   "r"(kX) : "memory");
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
          " [%0], [%1, {%2, %3}], [%4];" ::"r"(base + st * kX),
          "l"(reinterpret_cast<uint64_t>(&xmap)), "r"(kt * kA8K), "r"(m0), "r"(full(st))
          : "memory");
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");

  const int g = lane >> 2, t = lane & 3;
  const int nt = cblk * 8 + wg * 4 + warp;  // this warp's 32-channel repacked tile
  const uint4* wt = w + (int64_t)min(nt, nt_count - 1) * kt_total * 32 + lane;
  auto rawload = [&](int kt) { raw_issue<kRR, kC>(raw0, tid, wt, kt, kt_total); };
  auto rawread = [&](int kt) { return raw_piece<kRR, kC>(sbase + S * kX, tid, kt, kt_total); };

  int d[2][64];
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int i = 0; i < 64; ++i) d[b][i] = 0;
  uint32_t a[2][2][2][4];  // [buffer][k32 step][m64 block][register]
#pragma unroll
  for (int p = 0; p < kRR - 2; ++p) rawload(p);
  cp_async_wait<kRR - 3>();
  a8_decode(rawread(0), a[0]);
  cp_async_wait<kRR - 4>();
  uint4 q = rawread(1);

  // half step hk (a 64-wide k tile; stage hk / 2): wgmma of A(hk) against its half of the
  // stage, committed as one group; once group hk - 1 retired, its stage is released (at the
  // first half of the next stage) and A(hk + 1) decoded from the piece read last step.
  auto half = [&](int hk, uint32_t (&acur)[2][2][4], uint32_t (&anext)[2][2][4]) {
    const int st = (hk >> 1) % S;
    if ((hk & 1) == 0) mbar_wait(full(st), (uint32_t)((hk >> 1) / S) & 1);
    a8_pin(d);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    const uint32_t lo = lo0 + st * (kX >> 4) + (hk & 1) * (64 >> 4);
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int b = 0; b < 2; ++b) wgmma_a8(d[b], acur[s][b], wg_desc(lo + s * kWgStepLo));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    if ((hk & 1) == 0 && hk >= 2) mbar_arrive(empty(((hk >> 1) - 1) % S));
    a8_pin(anext);
    a8_decode(q, anext);
    a8_pin(acur);
    a8_pin(d);
    cp_async_wait<kRR - 5>();  // piece hk + 2 (this thread's own)
    q = rawread(hk + 2);
    rawload(hk + kRR - 2);
  };
  const int halves = 2 * stages;
  for (int hk = 0; hk < halves; hk += 2) {
    half(hk, a[0], a[1]);
    half(hk + 1, a[1], a[0]);
  }
  cp_async_wait<0>();
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  a8_pin(a[0]);
  a8_pin(a[1]);
  a8_pin(d);

  // Epilogue: the tile, scaled, through shared memory (the x ring, which every wgmma is done
  // with after the barrier), rows of kA8Cols + kA8Pad elements, in passes of kTok tokens
  // where a tile of 4-byte outputs does not fit; then 8-byte stores of token rows.
  constexpr int kRow = kA8Cols + 4,  // 4 elements of padding: rows 2 apart 4 or 8 banks apart
                kPasses = sizeof(OutT) / 2, kTok = kA8Rows / kPasses;
  static_assert(kTok * kRow * (int)sizeof(OutT) <= S * kX, "the output pass fits the x ring");
  OutT* const ys = reinterpret_cast<OutT*>(sbase);
  float sc[2][2], bs[2][2];
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int col = c0 + 128 * wg + 32 * warp + 16 * b + 8 * hi + g;
      sc[b][hi] = col < n ? scale[per_tensor ? 0 : col] : 0.f;
      if constexpr (std::is_same_v<OutT, int32_t>) bs[b][hi] = 0.f;  // (no bias with the sums)
      else bs[b][hi] = bias != nullptr && col < n ? to_float(bias[col]) : 0.f;
    }
  constexpr int kPer8 = 8 / (int)sizeof(OutT);  // elements an 8-byte chunk
  const bool vec = n % kPer8 == 0 && (reinterpret_cast<uintptr_t>(y) & 7) == 0;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    asm volatile("bar.sync 1, 256;" ::: "memory");  // the ring (or the last pass) is free
#pragma unroll
    for (int j = 0; j < kTok / 8; ++j) {
      const int jj = p * (kTok / 8) + j;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tk = 8 * j + 2 * t + e, row = m0 + 8 * jj + 2 * t + e;
        const int rs = row < m ? rsum[row] : 0;
        const float sr = row < m ? s[row] : 1.f;
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            const int ch = 128 * wg + 32 * warp + 16 * b + 8 * hi + g;
            ys[tk * kRow + ch] = a8_out<OutT>(d[b][4 * jj + 2 * hi + e] - rs, sc[b][hi], sr,
                                              bs[b][hi]);
          }
      }
    }
    asm volatile("bar.sync 1, 256;" ::: "memory");
    constexpr int kChunks = kTok * kA8Cols / kPer8, kRowChunks = kA8Cols / kPer8;
#pragma unroll 1
    for (int id = tid; id < kChunks; id += kC) {
      const int tk = id / kRowChunks, cc = id % kRowChunks;
      const int row = m0 + p * kTok + tk, col = c0 + cc * kPer8;
      if (row >= m || col >= n) continue;
      const OutT* src = ys + tk * kRow + cc * kPer8;
      OutT* dst = y + (int64_t)row * n + col;
      if (vec) {
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
      } else {
#pragma unroll
        for (int i = 0; i < kPer8; ++i)
          if (col + i < n) dst[i] = src[i];
      }
    }
  }
#endif
}

constexpr int a8_wgmma_smem() {
  return kA8Stages * kA8Rows * kA8K + kA8Raw * kA8Consumers * 16 + 2 * kA8Stages * 8 + 1024;
}

// xp [m, kp] uint8 in boxes of 128 k x 128 rows, 128-byte swizzled; past m or kp: zeros
bool a8_tensor_map(CUtensorMap* map, const int8_t* xp, int64_t m, int64_t kp) {
  const TensorMapEncode encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {(cuuint64_t)kp, (cuuint64_t)m};
  const cuuint64_t strides[1] = {(cuuint64_t)kp};
  const cuuint32_t box[2] = {(cuuint32_t)kA8K, (cuuint32_t)kA8Rows}, step[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<int8_t*>(xp), dims, strides,
                box, step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename OutT>
cudaError_t launch_typed(const int8_t* xp, int64_t kp, const float* s, const int32_t* rsum,
                         const uint8_t* repacked, const float* scale, const void* bias, void* y,
                         int64_t m, int64_t n, int64_t k, bool per_tensor, cudaStream_t stream) {
  constexpr int kSmem = a8_wgmma_smem();
  auto kernel = a8_wgmma_kernel<OutT>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  CUtensorMap xmap{};
  if (!a8_tensor_map(&xmap, xp, m, kp)) return cudaErrorInvalidValue;
  const int64_t nb = (n + kA8Cols - 1) / kA8Cols, mb = (m + kA8Rows - 1) / kA8Rows;
  if (nb * mb > INT32_MAX) return cudaErrorInvalidConfiguration;
  kernel<<<(unsigned)(nb * mb), 384, kSmem, stream>>>(
      reinterpret_cast<const uint4*>(repacked), s, rsum, scale, (const OutT*)bias, (OutT*)y,
      (int)m, (int)n, (int)((k + kTileK - 1) / kTileK), (int)((n + kTileN - 1) / kTileN),
      per_tensor, (int)nb, xmap);
  return cudaGetLastError();
}

}  // namespace TERNARY_TU

int64_t gemm_a8_wgmma_kp(int64_t k) { return (k + kTileK - 1) / kTileK * kTileK; }

int64_t gemm_a8_wgmma_tiles(int64_t m, int64_t n) {
  return (m + kA8Rows - 1) / kA8Rows * ((n + kA8Cols - 1) / kA8Cols);
}

cudaError_t launch_a8_permute(const int8_t* xq, int64_t ldq, int64_t k, int8_t* xp, int32_t* rsum,
                              int64_t m, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  const int64_t kp = gemm_a8_wgmma_kp(k);
  a8_permute_kernel<<<(unsigned)(m < 65536 ? m : 65536), 128, 0, stream>>>(xq, ldq, k, xp, kp,
                                                                          rsum, m);
  return cudaGetLastError();
}

cudaError_t launch_gemm_a8_wgmma(const int8_t* xp, const float* s, const int32_t* rsum,
                                 const uint8_t* repacked, const float* scale, const void* bias,
                                 void* y, A8Out out, int64_t m, int64_t n, int64_t k,
                                 bool per_tensor, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0) return cudaSuccess;
  if (m > INT32_MAX - 512 || n > INT32_MAX - 512 || k > INT32_MAX - 128) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(xp) & 15) || (reinterpret_cast<uintptr_t>(repacked) & 15))
    return cudaErrorInvalidValue;
  const int64_t kp = gemm_a8_wgmma_kp(k);
  switch (out) {
    case A8Out::kHalf:
      return launch_typed<__half>(xp, kp, s, rsum, repacked, scale, bias, y, m, n, k, per_tensor, stream);
    case A8Out::kBFloat16:
      return launch_typed<__nv_bfloat16>(xp, kp, s, rsum, repacked, scale, bias, y, m, n, k,
                                         per_tensor, stream);
    case A8Out::kFloat:
      return launch_typed<float>(xp, kp, s, rsum, repacked, scale, bias, y, m, n, k, per_tensor, stream);
    case A8Out::kInt32:
      return launch_typed<int32_t>(xp, kp, s, rsum, repacked, scale, bias, y, m, n, k, per_tensor,
                                   stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ternary
