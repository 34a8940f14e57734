// Hopper (sm_90a) synchronization primitives for warp-specialized kernels (paged_attention_wgmma_ws.cu):
// shared-memory mbarriers (init, arrive, parity wait, the asynchronous arrive of a thread's cp.asyncs), named
// barriers over a subset of the block's warps, and setmaxnreg (moving registers from the producer warpgroup to
// the consumer ones). Only compiled in sm_90a device passes (MX_WGMMA_DEVICE, wgmma_tile.cuh).
#pragma once

#include <cstdint>

#include "kernels/cuda/attention/wgmma_tile.cuh"

#ifdef MX_WGMMA_DEVICE
namespace mxserve::kernels::cuda::sm90 {

// An mbarrier completes a phase after `count` arrivals; waiters name the parity of the phase they wait for
// (0 first). A fresh barrier is in phase 0, so waiting for parity 1 returns at once (the producer's "every slot
// starts empty").
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile(
      "{\n"
      ".reg .b64 st;\n"
      "mbarrier.arrive.shared::cta.b64 st, [%0];\n"
      "}\n" ::"r"(bar)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "MX_MBAR_WAIT:\n"  // labels are local to the { } scope: one per inlined copy
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MX_MBAR_WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One arrival on `bar` once every cp.async this thread issued so far has landed (.noinc: the arrival counts
// against the barrier's init count, so a barrier of count N takes one such arrive from each of N threads).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// bar.sync on named barrier `id` (1..15; 0 is __syncthreads) among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive on named barrier `id`: counts toward its `threads` without waiting (the producer side of a turn).
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace mxserve::kernels::cuda::sm90
#endif
