// Index math of the FP8 E4M3 K/V tile loader (kv_fp8_tile.cuh), kept apart from the device code so a CPU test
// (tests/unit/kernels/test_kv_fp8_tile_layout.cpp) emulates it on the host: the raw stage layout
// [K codes KEYS x HD][V codes KEYS x HD][K scales KEYS][V scales KEYS], which thread copies which 16-byte chunk
// (issue) and which 8-code chunk it dequantizes (dequant), and the shared memory of one tile pipeline.
// Invariant: every function here is the one the kernels call (no second copy of the math); the bf16 tile's row
// stride is mma_tile::row_stride (HD + 8), checked by a static_assert in kv_fp8_tile.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MX_FP8T_HD __host__ __device__ __forceinline__
#else
#define MX_FP8T_HD inline
#endif

namespace mxserve::kernels::cuda::kv_fp8_tile {

// A chunk of one tile row: row j (key k0 + j) and its first column (element = code byte).
struct Chunk {
  int row, col;
};

constexpr int kIssueBytes = 16;  // codes per cp.async (one 16-byte copy)
constexpr int kDequantCodes = 8;  // codes per dequantization step (one uint2 in, one 16-byte bf16 vector out)

MX_FP8T_HD constexpr int bf16_row_stride(int hd) { return hd + 8; }  // == mma_tile::row_stride<HD>()

// Stage layout (bytes from the stage's start).
MX_FP8T_HD constexpr int codes_bytes(int hd, int keys) { return keys * hd; }  // one of K / V
MX_FP8T_HD constexpr size_t stage_bytes(int hd, int keys) {
  return 2 * static_cast<size_t>(codes_bytes(hd, keys)) + 2 * static_cast<size_t>(keys) * sizeof(float);
}
MX_FP8T_HD constexpr int k_code_at(int hd, int j, int col) { return j * hd + col; }
MX_FP8T_HD constexpr int v_code_at(int hd, int keys, int j, int col) { return codes_bytes(hd, keys) + j * hd + col; }
MX_FP8T_HD constexpr int k_scale_at(int hd, int keys, int j) {
  return 2 * codes_bytes(hd, keys) + j * static_cast<int>(sizeof(float));
}
MX_FP8T_HD constexpr int v_scale_at(int hd, int keys, int j) { return k_scale_at(hd, keys, keys + j); }

// Work item c (c = tid, tid + NT, ... below the count) of the issue and the dequantization loops.
MX_FP8T_HD constexpr int issue_chunks(int hd, int keys) { return keys * (hd / kIssueBytes); }
MX_FP8T_HD constexpr Chunk issue_chunk(int hd, int c) {
  return {c / (hd / kIssueBytes), (c % (hd / kIssueBytes)) * kIssueBytes};
}
MX_FP8T_HD constexpr int dequant_chunks(int hd, int keys) { return keys * (hd / kDequantCodes); }
MX_FP8T_HD constexpr Chunk dequant_chunk(int hd, int c) {
  return {c / (hd / kDequantCodes), (c % (hd / kDequantCodes)) * kDequantCodes};
}

// The byte offset of (slot, kv head, col) in a [n_slots][n_kv_heads * hd] code cache.
MX_FP8T_HD constexpr int64_t cache_code_at(int64_t slot, int n_kv_heads, int hd, int kvh, int col) {
  return slot * (static_cast<int64_t>(n_kv_heads) * hd) + static_cast<int64_t>(kvh) * hd + col;
}

// Shared memory of one tile pipeline of `stages` stages (a warp's in the per-warp kernels, a block's in the
// shared ones): bf16 stages (bf16 cache, or the FP8 plain loader), or FP8 raw stages then the one bf16 tile
// (K rows then V rows) the dequantization writes.
MX_FP8T_HD constexpr size_t bf16_tile_bytes(int hd, int keys) {
  return 2 * static_cast<size_t>(keys) * bf16_row_stride(hd) * 2;
}
MX_FP8T_HD constexpr size_t pipeline_bytes(int hd, int keys, int stages, bool fp8_async) {
  return fp8_async ? stages * stage_bytes(hd, keys) + bf16_tile_bytes(hd, keys) : stages * bf16_tile_bytes(hd, keys);
}

}  // namespace mxserve::kernels::cuda::kv_fp8_tile
