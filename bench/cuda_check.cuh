// CK(call): the bench binaries' check of a CUDA runtime call (bench/kernel_lab.cu,
// bench/wgmma_overlap_probe.cu): on an error, print the call, the file and line and the
// runtime's message, and exit with status 2.
#pragma once
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(call)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                  \
                   cudaGetErrorString(e_));                                              \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)
