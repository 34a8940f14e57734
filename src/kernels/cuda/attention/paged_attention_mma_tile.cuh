// The per-tile tensor-core math of the paged GQA attention kernels (mma.sync m16n8k16, bf16 in, fp32 accumulate),
// shared by paged_attention_mma.cu (per-warp decode and block-shared prefill kernels) and cascade_attention.cu
// (shared-prefix decode): cp.async / ldmatrix / mma wrappers, the per-warp online-softmax state, Q fragments
// and process_tile (S = Q K^T, mask, online softmax, O += P V on one K/V tile in shared memory).
// Invariant: K/V tiles in shared memory are bf16 rows of stride HD + 8 (row_stride), whatever the cache dtype.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common/bf16.cuh"

namespace mxserve::kernels::cuda::mma_tile {

template <int HD>
constexpr int row_stride() {
  return HD + 8;  // 16-byte aligned rows; 8 consecutive rows hit distinct bank quads (ldmatrix conflict free)
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr(p)));
}

// d += a * b for one m16n8k16 tile. a: rows (g, g+8) x cols (2q, 2q+8) pairs; b: k (2q, 2q+8) x n g.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Per-warp softmax state: O accumulator fragments, running max and (lane-partial) sum of rows g, g + 8.
template <int HD>
struct WarpState {
  float o[HD / 8][4];
  float m[2];
  float l[2];
};

// Q of one token as A fragments: row = head within the group (zero past G), col = head dim.
template <int HD>
__device__ __forceinline__ void load_q(const bf16* qbase, int G, int lane, uint32_t (&qa)[HD / 16][4]) {
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i % 2), col = ks * 16 + 8 * (i / 2) + 2 * tq;
      qa[ks][i] = row < G ? *reinterpret_cast<const uint32_t*>(qbase + row * HD + col) : 0u;
    }
}

// One tile of KEYS keys (K and V rows in shared memory, row stride HD + 8) for one warp: S = Q K^T,
// mask keys >= kv_end, online softmax update, O += P V. Precondition: k0 < kv_end (>= 1 valid key).
template <int HD, int KEYS>
__device__ __forceinline__ void process_tile(const bf16* kd, const bf16* vd, int k0, int kv_end, float scale,
                                             const uint32_t (&qa)[HD / 16][4], WarpState<HD>& st, int lane,
                                             int tbase = INT_MAX, uint64_t tmask = 0) {
  constexpr int R = row_stride<HD>();
  constexpr int KSTEPS = HD / 16, NT = HD / 8, ST = KEYS / 8;
  const int tq = lane % 4;
  float s[ST][4];  // [key n8 tile][row g: 0,1 | row g+8: 2,3]
#pragma unroll
  for (int nt = 0; nt < ST; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks += 2) {
      uint32_t b0, b1, b2, b3;
      if (ks + 1 < KSTEPS) {
        ldsm_x4(b0, b1, b2, b3, kd + (nt * 8 + lane % 8) * R + ks * 16 + (lane / 8) * 8);
        mma16816(s[nt], qa[ks], b0, b1);
        mma16816(s[nt], qa[ks + 1], b2, b3);
      } else {
        ldsm_x2(b0, b1, kd + (nt * 8 + lane % 8) * R + ks * 16 + ((lane / 8) % 2) * 8);
        mma16816(s[nt], qa[ks], b0, b1);
      }
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < ST; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = k0 + nt * 8 + 2 * tq + (e % 2);
      const bool visible = key < kv_end && (key < tbase || ((tmask >> (key - tbase)) & 1ull) != 0);
      s[nt][e] = visible ? s[nt][e] * scale : -INFINITY;
      mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
    }
  float alpha[2], m_use[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
    // -inf only while every key so far was masked (a tile of tree-masked keys): then nothing changes.
    const float m_new = fmaxf(st.m[hr], mx[hr]);
    alpha[hr] = st.m[hr] == -INFINITY ? 0.f : expf(st.m[hr] - m_new);
    st.m[hr] = m_new;
    st.l[hr] *= alpha[hr];
    m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
  }
#pragma unroll
  for (int nt = 0; nt < ST; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = expf(s[nt][e] - m_use[e / 2]);  // masked: exp(-inf) = 0
      st.l[e / 2] += s[nt][e];
    }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) st.o[n][e] *= alpha[e / 2];
#pragma unroll
  for (int j = 0; j < KEYS / 16; ++j) {
    const uint32_t pa[4] = {pack_bf16(s[2 * j][0], s[2 * j][1]), pack_bf16(s[2 * j][2], s[2 * j][3]),
                            pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]), pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t b0, b1, b2, b3;
      const int i = lane / 8;
      ldsm_x4_trans(b0, b1, b2, b3, vd + (j * 16 + (i % 2) * 8 + lane % 8) * R + n * 8 + (i / 2) * 8);
      mma16816(st.o[n], pa, b0, b1);
      mma16816(st.o[n + 1], pa, b2, b3);
    }
  }
}

template <int HD>
__device__ __forceinline__ void init_state(WarpState<HD>& st) {
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) st.o[n][e] = 0.f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;
}

}  // namespace mxserve::kernels::cuda::mma_tile
