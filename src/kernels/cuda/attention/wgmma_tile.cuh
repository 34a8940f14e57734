// Device helpers of the Hopper prefill attention kernel (paged_attention_wgmma_ws.cu): the hand-applied 128-byte
// swizzle of a [column block 2][rows][128 B] bf16 tile (the layout wgmma's 128B-swizzle descriptors read,
// common/wgmma_sm90.cuh), 16-byte cp.async with zero fill, and the bf16x2
// pack of the P operand. MX_WGMMA_DEVICE is defined only in sm_90a device passes (wgmma, setmaxnreg exist
// there); elsewhere the kernels compile to a trap and the host never launches them.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MX_WGMMA_DEVICE 1

namespace mxserve::kernels::cuda::wgmma_tile {

// Byte offset of 16-byte chunk `chunk` (0..15: 8 bf16 of a 128-wide head row) of row `row` in a
// [column block 2][rows][128 B] tile whose column blocks are col_block_bytes apart; chunk ^ (row % 8) inside
// each 1024-byte 8-row atom (the 128B swizzle).
__device__ __forceinline__ uint32_t swz(int row, int chunk, uint32_t col_block_bytes) {
  return (chunk >> 3) * col_block_bytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// 16 bytes global -> shared; valid == false writes 16 zero bytes (src is not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace mxserve::kernels::cuda::wgmma_tile
#endif
