// Streamed global loads for weights read once per launch (the MXFP4 decode GEMV, design 9, the skinny GEMM): no L1 allocation
// (the activations keep L1), and L2::256B, so an L2 miss brings the whole 256-byte segment (the next k steps of
// the same weight row) and DRAM reads 256 contiguous bytes per row opening instead of the 64 one step needs.
#pragma once

#include <cstdint>

namespace mxserve::kernels::cuda {

__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t ld_stream4(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

}  // namespace mxserve::kernels::cuda
