// Paged causal GQA attention on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), FA2-style:
// one warp per (token, kv head, context split). The warp's 16 MMA rows are the token's query heads of
// that kv head (G <= 16, padded with zero rows), so decode gets tensor cores through GQA and every
// K/V tile is read once per head group. Keys stream through a private 3-stage cp.async pipeline of
// 16-key tiles; S = Q K^T stays in registers, the online softmax runs on the accumulator fragments
// and P (rounded to bf16) feeds the P V product directly as the A operand.
// Invariants: as the CUDA-core kernel (paged_attention.cu): token t attends to [0, kv_index[t]];
// split partials use the same workspace layout, merged by the same combine kernel.
// NOTE: warps share nothing, so prefill re-reads K/V per token from L2 (no cross-token tile reuse yet:
// the block-shared, wgmma prefill kernel is later work). ldmatrix / mma.sync / cp.async are the sm_80+
// seam; a HIP port maps them to MFMA and plain loads.
#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/attention/paged_attention_mma.h"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kKeys = 16;  // keys per tile
constexpr int kStages = 3;

template <int HD>
constexpr int row_stride() {
  return HD + 8;  // 16-byte aligned rows; 8 consecutive rows hit distinct bank quads (ldmatrix conflict free)
}

template <int HD>
constexpr size_t smem_per_warp() {
  return static_cast<size_t>(kStages) * 2 * kKeys * row_stride<HD>() * sizeof(bf16);
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

template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
    paged_attention_mma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                               const bf16* __restrict__ v_cache, const int32_t* __restrict__ token_seq,
                               const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                               bf16* __restrict__ out, float* __restrict__ ws, AttentionParams p, int n_splits,
                               int split_len, int64_t n_items) {
  constexpr int R = row_stride<HD>();
  constexpr int KSTEPS = HD / 16;  // k steps of Q K^T
  constexpr int NT = HD / 8;       // n8 tiles of O
  constexpr int CH = HD / 8;       // 16-byte chunks per K/V row
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= n_items) return;  // warps are independent: no block-wide barrier below
  bf16* wsm = reinterpret_cast<bf16*>(smem) + static_cast<size_t>(warp) * kStages * 2 * kKeys * R;

  const int split = static_cast<int>(item % n_splits);
  const int64_t tk = item / n_splits;
  const int kvh = static_cast<int>(tk % p.n_kv_heads);
  const int64_t t = tk / p.n_kv_heads;
  const int G = p.n_heads / p.n_kv_heads;
  const int n_ctx = kv_index[t] + 1;
  const int kv_begin = split * split_len;
  const int kv_end = min(n_ctx, kv_begin + split_len);
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * p.max_blocks_per_seq;
  const int64_t kv_width = static_cast<int64_t>(p.n_kv_heads) * HD;
  const int g = lane / 4, tq = lane % 4;

  // Q as A fragments: row = head within the group (zero past G), col = head dim.
  uint32_t qa[KSTEPS][4];
  const bf16* qbase = q + (t * p.n_heads + static_cast<int64_t>(kvh) * G) * HD;
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i % 2), col = ks * 16 + 8 * (i / 2) + 2 * tq;
      qa[ks][i] = row < G ? *reinterpret_cast<const uint32_t*>(qbase + row * HD + col) : 0u;
    }

  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kKeys - 1) / kKeys : 0;
  auto load_tile = [&](int stage, int tile) {
    bf16* kd = wsm + stage * 2 * kKeys * R;
    bf16* vd = kd + kKeys * R;
    const int k0 = kv_begin + tile * kKeys;
#pragma unroll
    for (int c = lane; c < kKeys * CH; c += 32) {
      const int j = c / CH, d = (c % CH) * 8;
      const int key = k0 + j;
      const bool ok = key < kv_end;
      int64_t off = 0;
      if (ok) off = (static_cast<int64_t>(table[key / p.block_size]) * p.block_size + key % p.block_size) * kv_width +
                    kvh * HD + d;
      cp_async16(kd + j * R + d, k_cache + off, ok);  // invalid keys are zero-filled: finite, then masked
      cp_async16(vd + j * R + d, v_cache + off, ok);
    }
  };

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g and g + 8; l is this lane's partial sum

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    cp_async_commit();
  }
  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncwarp();
    if (it + kStages - 1 < n_tiles) load_tile((it + kStages - 1) % kStages, it + kStages - 1);
    cp_async_commit();
    const bf16* kd = wsm + (it % kStages) * 2 * kKeys * R;
    const bf16* vd = kd + kKeys * R;

    float s[2][4];  // [key n8 tile][row g: 0,1 | row g+8: 2,3]
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
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
    const int k0 = kv_begin + it * kKeys;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + 2 * tq + (e % 2);
        s[nt][e] = key < kv_end ? s[nt][e] * p.scale : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }
    float alpha[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
      mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
      const float m_new = fmaxf(m[hr], mx[hr]);  // finite: the tile holds at least one key
      alpha[hr] = m[hr] == -INFINITY ? 0.f : expf(m[hr] - m_new);
      m[hr] = m_new;
      l[hr] *= alpha[hr];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = expf(s[nt][e] - m[e / 2]);  // masked: exp(-inf) = 0
        l[e / 2] += s[nt][e];
      }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e / 2];
    const uint32_t pa[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]), pack_bf16(s[1][0], s[1][1]),
                            pack_bf16(s[1][2], s[1][3])};
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t b0, b1, b2, b3;
      const int i = lane / 8;
      ldsm_x4_trans(b0, b1, b2, b3, vd + ((i % 2) * 8 + lane % 8) * R + n * 8 + (i / 2) * 8);
      mma16816(o[n], pa, b0, b1);
      mma16816(o[n + 1], pa, b2, b3);
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
  }
  const int64_t n_parts = static_cast<int64_t>(p.n_tokens) * p.n_heads * n_splits;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = g + 8 * hr;
    if (row >= G) continue;
    const int64_t head_row = t * p.n_heads + static_cast<int64_t>(kvh) * G + row;
    if (n_splits == 1) {
      const float inv = l[hr] > 0.f ? 1.f / l[hr] : 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
        *reinterpret_cast<uint32_t*>(out + head_row * HD + n * 8 + 2 * tq) =
            pack_bf16(o[n][2 * hr] * inv, o[n][2 * hr + 1] * inv);
    } else {
      const int64_t part = head_row * n_splits + split;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        ws[part * HD + n * 8 + 2 * tq] = o[n][2 * hr];
        ws[part * HD + n * 8 + 2 * tq + 1] = o[n][2 * hr + 1];
      }
      if (tq == 0) {
        ws[n_parts * HD + part] = m[hr];
        ws[n_parts * (HD + 1) + part] = l[hr];
      }
    }
  }
}

template <int HD>
void launch(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
            const int32_t* kv_index, const int32_t* block_tables, void* out, const AttentionParams& p, int n_splits,
            int split_len, void* workspace, cudaStream_t stream) {
  const size_t smem = kWarps * smem_per_warp<HD>();
  static bool configured = false;  // NOTE: > 48 KB of dynamic shared memory needs an opt-in, once
  if (!configured) {
    MX_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    configured = true;
  }
  const int64_t items = static_cast<int64_t>(p.n_tokens) * p.n_kv_heads * n_splits;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  MX_CHECK_LT(blocks, int64_t{1} << 31);
  paged_attention_mma_kernel<HD><<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k_cache), static_cast<const bf16*>(v_cache), token_seq,
      kv_index, block_tables, static_cast<bf16*>(out), static_cast<float*>(workspace), p, n_splits, split_len, items);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool paged_attention_mma_supports(const AttentionParams& p) {
  const int group = p.n_kv_heads > 0 ? p.n_heads / p.n_kv_heads : 0;
  return group >= 1 && group <= 16 &&
         (p.head_dim == 16 || p.head_dim == 32 || p.head_dim == 64 || p.head_dim == 128);
}

void paged_attention_mma_bf16(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                              const int32_t* kv_index, const int32_t* block_tables, void* out,
                              const AttentionParams& p, int n_splits, int split_len, void* workspace,
                              cudaStream_t stream) {
  switch (p.head_dim) {
    case 16: launch<16>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits, split_len, workspace, stream); break;
    case 32: launch<32>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits, split_len, workspace, stream); break;
    case 64: launch<64>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits, split_len, workspace, stream); break;
    case 128: launch<128>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits, split_len, workspace, stream); break;
    default: MX_CHECK_MSG(false, "paged_attention_mma: head_dim " << p.head_dim << " is not built");
  }
}

}  // namespace mxserve::kernels::cuda
