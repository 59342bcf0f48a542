// Launch helpers: programmatic dependent launch (device and host side), the environment
// switches that turn it and wgmma_big's persistent kernel off, and a cached occupancy query.
#pragma once

#include "common/tu.cuh"
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>

namespace ternary {
inline namespace TERNARY_TU {

// Programmatic dependent launch (sm_90+). A kernel launched with pdl (launch_k) may start while
// the kernel before it in the stream is still running: it issues what depends on no earlier
// kernel (the weight stream: weights, scales and bias are written only at load time) and then
// pdl_wait()s, which returns once every earlier kernel has finished and its writes are visible.
// Every thread waits before it reads x or writes y or a workspace (an earlier kernel may
// produce x, or still read the memory y now occupies). pdl_trigger() (sm_90+ bodies) lets
// the next kernel, where it was launched with pdl, start its own prologue. Launched without
// the attribute, or in a body built for an arch before sm_90, both are no-ops (so a caller
// launches with pdl only where the sm_90a image runs: sm90a_image_loaded).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// What an earlier kernel writes (x, linear_a8's s) is read after pdl_wait with coherent loads
// only: ptxas takes ld.global.nc (what __ldg and const __restrict__ pointers compile to) for
// memory that is read-only for the kernel's whole life and schedules it above
// griddepcontrol.wait, so a programmatic launch read x before the kernel before it had
// written it (the decode kernel's first x loads, on the H200 under CUDA graphs). An asm
// volatile, so that the compiler keeps it below the wait too.
__device__ __forceinline__ float ld_coherent(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

}  // namespace TERNARY_TU

// Switches for bisecting a hang inside a serving engine (tools/h200 tp-hang), read once a
// process (inline: one copy for every file): TERNARY_PDL=0 launches every kernel plainly,
// TERNARY_PERSISTENT=0 gives wgmma_big one block a tile. Results are the same either way; only
// overlap and speed move.
inline bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '0' && v[1] == '\0';
}
inline bool pdl_allowed() {
  static const bool on = !env_off("TERNARY_PDL");
  return on;
}
inline bool persistent_allowed() {
  static const bool on = !env_off("TERNARY_PERSISTENT");
  return on;
}

inline namespace TERNARY_TU {

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization
// attribute where pdl (which the caller sets only on sm_90+ devices). A launch the attribute
// makes fail (a driver or platform without programmatic launch) is made again plainly, which
// only orders it more strictly.
template <typename... P, typename... A>
cudaError_t launch_k(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, bool pdl, const A&... args) {
  pdl = pdl && pdl_allowed();
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess && pdl) {
    (void)cudaGetLastError();
    cfg.numAttrs = 0;
    e = cudaLaunchKernelEx(&cfg, kernel, args...);
  }
  return e;
}

// Blocks of `threads` threads and `smem` dynamic shared bytes that fit an SM of the current
// device, cached in the caller's per-device array (the first call asks the runtime; no launch,
// so it is safe during graph capture); 1 when the runtime cannot say.
template <typename K>
int occupancy_blocks(K kernel, int threads, size_t smem, std::atomic<int> (&cached)[64]) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 1;
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int blocks = 0;
    if (smem > 48 * 1024)
      (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) !=
            cudaSuccess ||
        blocks < 1)
      blocks = 1;
    (void)cudaGetLastError();
    v = blocks;
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

}  // namespace TERNARY_TU
}  // namespace ternary
