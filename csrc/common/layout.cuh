// The fused ternary gemm unpacks, dequantizes and multiplies in one pass over a weight layout
// made for it at load time (fused/repack.cu), with no dense weight anywhere in memory.
//
// Layout ("repacked", uint8 [ceil(N/32), ceil(K/64), 512]): one 512-byte tile per 32 output
// channels x 64 inputs, 16 bytes per lane of a warp, so a warp reads a tile with one
// coalesced 16-byte load per lane and each lane gets exactly the codes of its mma.sync
// m16n8k16 B fragments (4 n8 fragments x 4 k16 steps). Inside lane (g = lane/4, t = lane%4)'s
// 16 bytes, 32-bit word w, pair j = 2f + r, half h: bits 16h + 2j hold the code of
//   n = 32 nt + 8 f + g,   k = 64 kt + 16 t + 4 w + 2 r + h.
// The k order is permuted inside a tile so that the same lane's A fragments (activations)
// are 16 consecutive elements of one x row: two 16-byte loads from L1, no shared memory.
// Codes outside [N, K] are 1 (w = 0).
//
// The headers under common/ and fused/ keep their kernels and device helpers in an anonymous
// namespace: each .cu file that includes them compiles its own copy. What crosses from one
// file to another is the launchers that fused/launchers.h declares and the inline switches of
// common/launch.cuh.
#pragma once

#include "common/tu.cuh"

namespace ternary {
inline namespace TERNARY_TU {

constexpr int kTileN = 32;
constexpr int kTileK = 64;
constexpr int kTileBytes = 512;

}  // namespace TERNARY_TU
}  // namespace ternary
