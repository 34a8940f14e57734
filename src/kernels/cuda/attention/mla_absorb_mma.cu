// The absorb and un-absorb steps of absorbed MLA (glm_moe_dsa) as batched tensor-core GEMMs, one batch entry
// per head, for the Hopper attend path (MlaAttendKernel::kWgmma, mla_attention.cu):
//   absorb:   q_abs[t, h, :] (bf16) = q_nope[t, h, :] W_uk[h]     W_uk[h] = kv_b rows [h (nope + v), +nope), [k][n]
//   unabsorb: out[t, h, :]   (bf16) = o_lat[t, h, :] W_uv[h]^T   W_uv[h] = kv_b rows [h (nope + v) + nope, +v), [n][k]
// Tiles of 64 tokens x 64 outputs x 64-deep K (mma.sync m16n8k16, fp32 accumulate, operands through padded
// shared memory with ldmatrix; the next K slice is prefetched into registers while the current one multiplies).
// Decode is bound by the weight bytes (each weight tile is read once per 64 tokens); the CUDA-core kernels of
// mla_attention.cu stay the oracle. Shapes: qk_nope_dim % 64 == 0 or % 32 (a zero-padded last slice), v_dim % 64
// == 0, kv_lora_rank % 64 == 0 (mla_attend_wgmma_supported checks the GLM-5.x shape). Never allocates or syncs.
#include <cuda_bf16.h>

#include "core/check.h"
#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 64, kPad = kBK + 8;  // 144-byte smem rows: ldmatrix conflict-free

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// C[b][m][n] = sum_k A[b][m][k] B_b(k, n): A rows of K contiguous bf16 (a + b sa_b + m sa_m), B either [k][n]
// (kBKN, b_ptr + b sb_b + k sb_r + n) or [n][k] (b_ptr + b sb_b + n sb_r + k); C bf16, row stride sc_m.
// Grid (N / 64, ceil(M / 64), batch), 128 threads: warp w computes rows [16 w, +16) x the tile's 64 columns.
template <bool kBKN>
__global__ void __launch_bounds__(128) batched_gemm_kernel(const bf16* __restrict__ a, int64_t sa_b, int64_t sa_m,
                                                           const bf16* __restrict__ b_ptr, int64_t sb_b, int64_t sb_r,
                                                           bf16* __restrict__ c, int64_t sc_b, int64_t sc_m, int64_t m_rows,
                                                           int k_dim) {
  __shared__ __align__(16) bf16 a_s[kBM][kPad];
  __shared__ __align__(16) bf16 b_s[kBK][kPad];  // [k][n] (kBKN) or [n][k]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN, m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const bf16* a_b = a + blockIdx.z * sa_b;
  const bf16* b_b = b_ptr + blockIdx.z * sb_b;
  uint4 ra[4], rb[4];
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = tid + 128 * i, row = idx / 8, ch = idx % 8;
      const bool a_ok = m0 + row < m_rows && k0 + 8 * ch < k_dim;
      ra[i] = a_ok ? *reinterpret_cast<const uint4*>(a_b + (m0 + row) * sa_m + k0 + 8 * ch) : make_uint4(0, 0, 0, 0);
      const bool b_ok = kBKN ? k0 + row < k_dim : k0 + 8 * ch < k_dim;
      const bf16* src = kBKN ? b_b + (k0 + row) * sb_r + n0 + 8 * ch : b_b + (n0 + row) * sb_r + k0 + 8 * ch;
      rb[i] = b_ok ? __ldg(reinterpret_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
    }
  };
  float acc[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  load(0);
  for (int k0 = 0; k0 < k_dim; k0 += kBK) {
    __syncthreads();  // the previous slice's readers are done
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = tid + 128 * i, row = idx / 8, ch = idx % 8;
      *reinterpret_cast<uint4*>(&a_s[row][8 * ch]) = ra[i];
      *reinterpret_cast<uint4*>(&b_s[row][8 * ch]) = rb[i];
    }
    __syncthreads();
    if (k0 + kBK < k_dim) load(k0 + kBK);  // in flight under this slice's MMAs
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[4];
      ldsm_x4(af, &a_s[16 * warp + (lane & 15)][16 * kk + 8 * (lane >> 4)]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bf[4];
        if constexpr (kBKN)
          ldsm_x4_trans(bf, &b_s[16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)][16 * np + 8 * (lane >> 4)]);
        else
          ldsm_x4(bf, &b_s[16 * np + (lane & 7) + 8 * (lane >> 4)][16 * kk + 8 * ((lane >> 3) & 1)]);
        mma_bf16_m16n8k16(acc[2 * np], af, bf[0], bf[1]);
        mma_bf16_m16n8k16(acc[2 * np + 1], af, bf[2], bf[3]);
      }
    }
  }
  const int g = lane >> 2, t4 = lane & 3;
  bf16* c_b = c + blockIdx.z * sc_b;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int64_t m = m0 + 16 * warp + g + 8 * hr;
    if (m >= m_rows) continue;
#pragma unroll
    for (int n = 0; n < 8; ++n)
      *reinterpret_cast<__nv_bfloat162*>(c_b + m * sc_m + n0 + 8 * n + 2 * t4) =
          __floats2bfloat162_rn(acc[n][2 * hr], acc[n][2 * hr + 1]);
  }
}

}  // namespace

bool mla_absorb_gemm_supported(const MlaParams& p) {
  return p.qk_nope_dim % 32 == 0 && p.v_dim % kBN == 0 && p.kv_lora_rank % kBN == 0 && p.kv_lora_rank % kBK == 0;
}

void mla_absorb_gemm_bf16(const void* q, const void* kv_b, void* q_abs, int64_t t0, int64_t n_tokens,
                          const MlaParams& p, cudaStream_t stream) {
  if (n_tokens == 0) return;
  MX_CHECK_MSG(mla_absorb_gemm_supported(p), "mla_absorb_gemm_bf16: qk_nope_dim " << p.qk_nope_dim << ", v_dim "
                                                                                   << p.v_dim << ", kv_lora_rank "
                                                                                   << p.kv_lora_rank
                                                                                   << " (dispatch bug)");
  const int NH = p.n_heads, NOPE = p.qk_nope_dim, L = p.kv_lora_rank;
  const int64_t q_stride = NOPE + p.qk_rope_dim;
  const dim3 grid(static_cast<unsigned>(L / kBN), static_cast<unsigned>((n_tokens + kBM - 1) / kBM),
                  static_cast<unsigned>(NH));
  batched_gemm_kernel<true><<<grid, 128, 0, stream>>>(
      static_cast<const bf16*>(q) + t0 * NH * q_stride, q_stride, NH * q_stride, static_cast<const bf16*>(kv_b),
      static_cast<int64_t>(NOPE + p.v_dim) * L, L, static_cast<bf16*>(q_abs), L, static_cast<int64_t>(NH) * L,
      n_tokens, NOPE);
  MX_CUDA_CHECK_LAUNCH();
}

void mla_unabsorb_gemm_bf16(const void* o_lat, const void* kv_b, void* out, int64_t t0, int64_t n_tokens,
                            const MlaParams& p, cudaStream_t stream) {
  if (n_tokens == 0) return;
  MX_CHECK_MSG(mla_absorb_gemm_supported(p), "mla_unabsorb_gemm_bf16: qk_nope_dim "
                                                 << p.qk_nope_dim << ", v_dim " << p.v_dim << ", kv_lora_rank "
                                                 << p.kv_lora_rank << " (dispatch bug)");
  const int NH = p.n_heads, NOPE = p.qk_nope_dim, V = p.v_dim, L = p.kv_lora_rank;
  const dim3 grid(static_cast<unsigned>(V / kBN), static_cast<unsigned>((n_tokens + kBM - 1) / kBM),
                  static_cast<unsigned>(NH));
  batched_gemm_kernel<false><<<grid, 128, 0, stream>>>(
      static_cast<const bf16*>(o_lat), L, static_cast<int64_t>(NH) * L,
      static_cast<const bf16*>(kv_b) + static_cast<int64_t>(NOPE) * L, static_cast<int64_t>(NOPE + V) * L, L,
      static_cast<bf16*>(out) + t0 * NH * V, V, static_cast<int64_t>(NH) * V, n_tokens, L);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
