// The sm_80+ tensor-core and async-copy instructions the MXFP4 MoE kernels share (mma.sync bf16 m16n8k16,
// cp.async 16/4 bytes, group commit/wait). One definition, so a HIP port swaps them in one place (MFMA,
// plain loads). NOTE: the attention and bf16 MoE kernels still carry their own copies (no "memory" clobber).
#pragma once

#include <cstdint>

namespace mxserve::kernels::cuda {

// c += a * b for one m16n8k16 tile, bf16 in, fp32 accumulate. a: rows (g, g+8) x k pairs; b: k pairs x n g.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared, bypassing L1.
__device__ __forceinline__ void cp_async_cg16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// The same, zero-filled when !valid (gmem must still be a mapped address).
__device__ __forceinline__ void cp_async_cg16_zfill(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
// 4 bytes global -> shared (through L1), zero-filled when !valid.
__device__ __forceinline__ void cp_async_ca4_zfill(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kN committed groups are still in flight.
template <int kN>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace mxserve::kernels::cuda
