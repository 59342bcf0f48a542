// cp.async (sm_80+) and the weight rings built on it.
#pragma once

#include "common/tu.cuh"
#include <cuda_runtime.h>

#include <cstdint>

namespace ternary {
inline namespace TERNARY_TU {

// 16-byte global -> shared copy that bypasses L1 and the registers (a lane later reads back
// only what it copied itself, so no barrier is needed, only the group wait).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// "memory": the ring's shared-memory reads after the wait must not move above it.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The wgmma kernels' weight rings: each consumer thread cp.asyncs its own 16-byte piece of
// k tile kt (one commit group a tile, empty past `count`) into slot kt % DEPTH of a ring of
// STRIDE pieces a slot at shared address ring (generic pointer ring_g), and reads it back
// after its group wait.
template <int DEPTH, int STRIDE>
__device__ __forceinline__ void raw_issue(uint32_t ring, int tid, const uint4* src, int kt,
                                          int count) {
  if (kt < count)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ring + ((kt % DEPTH) * STRIDE + tid) * 16),
                 "l"(src + (int64_t)kt * 32));
  cp_async_commit();
}
template <int DEPTH, int STRIDE>
__device__ __forceinline__ uint4 raw_piece(const uint8_t* ring_g, int tid, int kt, int count) {
  return kt < count ? *reinterpret_cast<const uint4*>(ring_g + ((kt % DEPTH) * STRIDE + tid) * 16)
                    : make_uint4(0, 0, 0, 0);
}

// Issues k tile kt of a warp's NT weight tiles into slot `slot` of its cp.async ring (NT x 32
// lanes of uint4 a slot); a kt past the end issues nothing but still commits a group, so the
// group count stays the step count the waits rely on.
template <int NT>
__device__ __forceinline__ void ring_issue(uint4* ring, int slot, const uint4* const (&wt)[NT],
                                           int kt, int kt_count) {
  if (kt < kt_count) {
#pragma unroll
    for (int j = 0; j < NT; ++j) cp_async16(ring + (slot * NT + j) * 32, wt[j] + (int64_t)kt * 32);
  }
  cp_async_commit();
}

}  // namespace TERNARY_TU
}  // namespace ternary
