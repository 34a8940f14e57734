// The DeepSeek sparse-attention indexer on CUDA (glm_moe_dsa): per query token t and visible key j,
// score = sum_h w[t, h] * weight_scale * ReLU(q[t, h] . key[j] * score_scale) in fp32 (the CPU reference's
// order of operations), then the exact top-k per token: ties to the lower KV index, the selection written
// in ascending KV order, -1 padded; every visible key when there are at most top_k.
// Two kernels per group of tokens: scores (one block per (token, 128 keys), the keys staged through shared
// memory) into a u32 workspace of order-preserving score codes (0 = not visible), then one block per token
// selects: a 4-pass 8-bit radix select finds the k-th largest code, an ordered block scan writes the set.
// Scores run on tensor cores (dsa_scores_mma_kernel: q [heads x D] x keys^T per 128-key block, mma.sync bf16
// with fp32 accumulate, the ReLU-weighted head sum in registers) when n_heads is a multiple of 16 (<= 64)
// and head_dim a multiple of 16 whose tiles fit 48 KiB; else the SIMT kernel (one thread per key, the
// oracle) with a one-time warning. Both write the same codes; the exact radix select is shared. The
// workspace is one u32 per (token, key) for at most kScoreBudget bytes of tokens at a time. No FP8 yet.
// IndexerScoreKernel::kFused (and kAuto up to kIndexerFusedMaxRows rows) goes to dsa_indexer_fused.cu
// instead: scores + histogram split over the SMs, one select block per token, rows <= top_k skipped
// (kFusedSplit: the select of a token over a thread-block cluster, dsa_select_split.cu).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/attention/dsa_indexer_fused.h"
#include "kernels/cuda/attention/mla_visibility.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "core/check.h"
#include "core/logging.h"
#include "kernels/cuda/common/mma_sm80.cuh"
// FP8 indexer keys (p.fp8_keys, kernels/mla_fp8.h: head_dim e4m3 + f32 scales per row; --kv-cache-dtype
// fp8_e4m3): both score kernels below dequantize the gathered key rows into their bf16 key tile at the load
// (mla_fp8_load.cuh); the math after the load is unchanged. (Supersedes "No FP8 yet." above.)
#include "kernels/cuda/attention/mla_fp8_load.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kIdxKeys = 128;       // keys (= threads) per score block
constexpr int kSelThreads = 512;    // threads of the select block
constexpr int64_t kScoreBudget = int64_t{256} << 20;

__device__ __forceinline__ void ldsm_x4_b16(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

__host__ __device__ inline size_t align16(size_t b) { return (b + 15) & ~size_t{15}; }

// Monotone map float -> u32 (larger float, larger code); +-0 both map to 0x80000000. Finite floats map
// above 0x007fffff, so 0 is free to mean "not visible".
__device__ __forceinline__ uint32_t order_code(float f) {
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void dsa_scores_kernel(const bf16* __restrict__ q, const bf16* __restrict__ weights,
                                  const bf16* __restrict__ key_cache, const int32_t* __restrict__ token_seq,
                                  const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                                  uint32_t* __restrict__ codes, int64_t stride, int64_t t0, IndexerParams p,
                                  AttentionParams ap) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int NH = p.n_heads, D = p.head_dim, pitch = D + 2;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  float* w_s = reinterpret_cast<float*>(smem + align16(static_cast<size_t>(NH) * D * 2));
  bf16* k_s = reinterpret_cast<bf16*>(reinterpret_cast<unsigned char*>(w_s) + align16(static_cast<size_t>(NH) * 4));
  const int64_t tl = blockIdx.y, t = t0 + tl;
  const MlaVisibility vis = mla_visibility(kv_index, ap, t);
  const int64_t n_ctx = vis.n_ctx < stride ? vis.n_ctx : stride;  // kv_index + 1 <= max_kv_len (AttentionParams)
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kIdxKeys;
  if (j0 >= n_ctx) return;  // the whole block: the select kernel reads codes [0, n_ctx) only
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * ap.max_blocks_per_seq;
  for (int i = threadIdx.x; i < NH * D; i += blockDim.x) q_s[i] = q[t * NH * D + i];
  for (int i = threadIdx.x; i < NH; i += blockDim.x) w_s[i] = to_f32(weights[t * NH + i]) * p.weight_scale;
  for (int i = threadIdx.x; i < kIdxKeys * D; i += blockDim.x) {
    const int k = i / D, d = i % D;
    const int64_t j = j0 + k;
    if (j < n_ctx && p.fp8_keys) {  // packed FP8 row (kernels/mla_fp8.h)
      const uint8_t* row = reinterpret_cast<const uint8_t*>(key_cache) +
                           mla_slot(table, j, ap.block_size) * mla_fp8_row_bytes(D, 0);
      k_s[k * pitch + d] = __float2bfloat16_rn(mla_fp8_row_value(row, D, d));
    } else if (j < n_ctx) {
      k_s[k * pitch + d] = key_cache[mla_slot(table, j, ap.block_size) * D + d];
    }
  }
  __syncthreads();
  const int64_t j = j0 + threadIdx.x;
  if (j >= n_ctx) return;
  uint32_t code = 0;
  if (vis(j)) {
    const bf16* key = k_s + threadIdx.x * pitch;
    float score = 0.f;
    for (int h = 0; h < NH; ++h) {
      const bf16* qh = q_s + h * D;
      float dot = 0.f;
      for (int d = 0; d < D; ++d) dot += to_f32(qh[d]) * to_f32(key[d]);
      score += w_s[h] * fmaxf(dot * p.score_scale, 0.f);
    }
    code = order_code(score);
  }
  codes[tl * stride + j] = code;
}

// Tensor-core scores. Block = 4 warps over 128 keys [j0, +128) of token t; warp w owns keys [32 w, +32).
// q_s [MT * 16][D + 8] (heads past n_heads zero), w_s [MT * 16] (weights * weight_scale, zero past n_heads),
// k_s [128][D + 8] (gathered by block table; rows past the context zero). acc = q . key per (head, key)
// in mma C fragments; each thread sums w * ReLU(acc * score_scale) over its heads (rows g, g + 8 of each
// m-tile), the 8 lanes sharing a key column reduce by shuffles.
template <int MT>
__global__ void __launch_bounds__(kIdxKeys) dsa_scores_mma_kernel(
    const bf16* __restrict__ q, const bf16* __restrict__ weights, const bf16* __restrict__ key_cache,
    const int32_t* __restrict__ token_seq, const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
    uint32_t* __restrict__ codes, int64_t stride, int64_t t0, IndexerParams p, AttentionParams ap) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int NH = p.n_heads, D = p.head_dim, pitch = D + 8;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = q_s + MT * 16 * pitch;
  float* w_s = reinterpret_cast<float*>(k_s + kIdxKeys * pitch);
  const int64_t tl = blockIdx.y, t = t0 + tl;
  const MlaVisibility vis = mla_visibility(kv_index, ap, t);
  const int64_t n_ctx = vis.n_ctx < stride ? vis.n_ctx : stride;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kIdxKeys;
  if (j0 >= n_ctx) return;
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * ap.max_blocks_per_seq;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  const int chunks = D / 8;
  for (int i = tid; p.fp8_keys && i < kIdxKeys * chunks; i += blockDim.x) {  // packed FP8 rows: load + dequantize
    const int r = i / chunks, c = i % chunks;
    const int64_t j = j0 + r;
    const uint8_t* row = reinterpret_cast<const uint8_t*>(key_cache) +
                         (j < n_ctx ? mla_slot(table, j, ap.block_size) : 0) * mla_fp8_row_bytes(D, 0);
    *reinterpret_cast<uint4*>(k_s + r * pitch + c * 8) = j < n_ctx ? mla_fp8_key_chunk(row, D, c) : make_uint4(0, 0, 0, 0);
  }
  for (int i = tid; !p.fp8_keys && i < kIdxKeys * chunks; i += blockDim.x) {
    const int r = i / chunks, c = i % chunks;
    const int64_t j = j0 + r;
    const bool ok = j < n_ctx;
    const bf16* src = ok ? key_cache + mla_slot(table, j, ap.block_size) * D + c * 8 : key_cache;
    cp_async_cg16_zfill(k_s + r * pitch + c * 8, src, ok);
  }
  cp_async_commit_group();
  for (int i = tid; i < MT * 16 * chunks; i += blockDim.x) {
    const int h = i / chunks, c = i % chunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < NH) v = *reinterpret_cast<const uint4*>(q + (t * NH + h) * D + c * 8);
    *reinterpret_cast<uint4*>(q_s + h * pitch + c * 8) = v;
  }
  for (int h = tid; h < MT * 16; h += blockDim.x) w_s[h] = h < NH ? to_f32(weights[t * NH + h]) * p.weight_scale : 0.f;
  cp_async_wait_all();
  __syncthreads();
  float acc[MT][4][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
  const bf16* kb = k_s + (warp * 32 + (lane & 7) + 8 * (lane >> 4)) * pitch + 8 * ((lane >> 3) & 1);
  const bf16* qa = q_s + ((lane & 7) + 8 * ((lane >> 3) & 1)) * pitch + 8 * (lane >> 4);
  for (int k0 = 0; k0 < D; k0 += 16) {
    uint32_t b[2][4];
    ldsm_x4_b16(b[0], kb + k0);
    ldsm_x4_b16(b[1], kb + 16 * pitch + k0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t a[4];
      ldsm_x4_b16(a, qa + 16 * mt * pitch + k0);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) mma_bf16_m16n8k16(acc[mt][nt], a, b[nt / 2][2 * (nt % 2)], b[nt / 2][2 * (nt % 2) + 1]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float score = 0.f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        score += w_s[16 * mt + g] * fmaxf(acc[mt][nt][e] * p.score_scale, 0.f);
        score += w_s[16 * mt + g + 8] * fmaxf(acc[mt][nt][2 + e] * p.score_scale, 0.f);
      }
      score += __shfl_xor_sync(0xffffffffu, score, 4);
      score += __shfl_xor_sync(0xffffffffu, score, 8);
      score += __shfl_xor_sync(0xffffffffu, score, 16);
      const int64_t j = j0 + warp * 32 + 8 * nt + 2 * tig + e;
      if (g == 0 && j < n_ctx) codes[tl * stride + j] = vis(j) ? order_code(score) : 0u;
    }
  }
}

size_t scores_mma_smem_bytes(const IndexerParams& p) {
  const int mt = (p.n_heads + 15) / 16;
  return static_cast<size_t>(mt * 16 + kIdxKeys) * (p.head_dim + 8) * 2 + static_cast<size_t>(mt) * 16 * 4;
}

__device__ __forceinline__ unsigned long long warp_inclusive_scan(unsigned long long v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

__global__ void dsa_select_kernel(const uint32_t* __restrict__ codes, int64_t stride, int64_t t0,
                                  const int32_t* __restrict__ kv_index, int32_t* __restrict__ topk, int K) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_krem;
  __shared__ unsigned long long warp_tot[kSelThreads / 32];
  __shared__ unsigned long long s_base;
  __shared__ int s_visible;
  const int64_t tl = blockIdx.x, t = t0 + tl;
  const int64_t n_ctx = static_cast<int64_t>(kv_index[t]) + 1;
  const int64_t n = n_ctx < stride ? n_ctx : stride;
  const uint32_t* row = codes + tl * stride;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) {
    s_visible = 0;
    s_base = 0;
  }
  __syncthreads();
  int visible = 0;
  for (int64_t j = tid; j < n; j += blockDim.x) visible += row[j] != 0 ? 1 : 0;
  for (int o = 16; o > 0; o >>= 1) visible += __shfl_xor_sync(0xffffffffu, visible, o);
  if (lane == 0) atomicAdd(&s_visible, visible);
  __syncthreads();
  uint32_t thr = 0, allowed_ties = 0;  // at most K visible: every code > 0 (the visible keys)
  if (s_visible > K) {
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      for (int64_t j = tid; j < n; j += blockDim.x) {
        const uint32_t c = row[j];
        if ((c & mask) == prefix) atomicAdd(&hist[(c >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        uint32_t krem = shift == 24 ? static_cast<uint32_t>(K) : s_krem, cum = 0;
        for (int b = 255; b >= 0; --b) {
          if (cum + hist[b] >= krem) {
            s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
            s_krem = krem - cum;
            break;
          }
          cum += hist[b];
        }
      }
      __syncthreads();
      prefix = s_prefix;
      mask |= 255u << shift;
    }
    thr = prefix;
    allowed_ties = s_krem;  // ties of the k-th code to keep, lowest KV index first
  }
  // Ordered compaction: selected before j = (codes > thr before j) + min(ties before j, allowed_ties).
  int32_t* out = topk + t * K;
  for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
    const int64_t j = c0 + tid;
    const uint32_t c = j < n ? row[j] : 0;
    const bool greater = c > thr, tie = thr != 0 && c == thr;
    const unsigned long long mine = (static_cast<unsigned long long>(greater) << 32) | (tie ? 1ull : 0ull);
    const unsigned long long incl = warp_inclusive_scan(mine);
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    unsigned long long before = s_base;
    for (int w = 0; w < warp; ++w) before += warp_tot[w];
    before += incl - mine;
    const uint32_t g_before = static_cast<uint32_t>(before >> 32), e_before = static_cast<uint32_t>(before);
    if (greater) out[g_before + min(e_before, allowed_ties)] = static_cast<int32_t>(j);
    else if (tie && e_before < allowed_ties) out[g_before + e_before] = static_cast<int32_t>(j);
    __syncthreads();
    if (tid == blockDim.x - 1) s_base = before + mine;
    __syncthreads();
  }
  const int selected = s_visible < K ? s_visible : K;
  for (int i = selected + tid; i < K; i += blockDim.x) out[i] = -1;
}

}  // namespace

bool dsa_indexer_mma_supported(const IndexerParams& p) {
  return p.n_heads >= 16 && p.n_heads <= 64 && p.n_heads % 16 == 0 && p.head_dim >= 16 && p.head_dim % 16 == 0 &&
         scores_mma_smem_bytes(p) <= 48 * 1024;
}

size_t dsa_indexer_smem_bytes(const IndexerParams& p) {
  return align16(static_cast<size_t>(p.n_heads) * p.head_dim * 2) + align16(static_cast<size_t>(p.n_heads) * 4) +
         static_cast<size_t>(kIdxKeys) * (p.head_dim + 2) * 2;
}

size_t dsa_indexer_workspace_bytes(int64_t n_tokens, int64_t max_ctx) {
  const int64_t row = static_cast<int64_t>(dsa_indexer_fused_row_bytes(max_ctx));  // >= the codes row of the others
  const int64_t group = std::max<int64_t>(1, std::min<int64_t>({n_tokens, kScoreBudget / row, 65535}));
  return static_cast<size_t>(group * row);
}

void dsa_indexer_topk(const void* q, const void* weights, const void* key_cache, const int32_t* token_seq,
                      const int32_t* kv_index, const int32_t* block_tables, int32_t* topk, const IndexerParams& p,
                      const AttentionParams& ap, int64_t max_ctx, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream, IndexerScoreKernel kernel) {
  const int64_t T = ap.n_tokens;
  if (T == 0) return;
  const bool fused_auto = T <= kIndexerFusedMaxRows && kernel == IndexerScoreKernel::kAuto &&
                          (!p.fp8_keys || kIndexerAutoFusedFp8) && dsa_indexer_fused_supported(p) &&
                          reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(key_cache) % 16 == 0;
  if (kernel == IndexerScoreKernel::kFused || kernel == IndexerScoreKernel::kFusedSplit || fused_auto) {
    const bool split = kernel == IndexerScoreKernel::kFusedSplit || (fused_auto && kIndexerAutoSplitSelect);
    dsa_indexer_topk_fused(q, weights, key_cache, token_seq, kv_index, block_tables, topk, p, ap, max_ctx, workspace,
                           workspace_bytes, stream, split);
    return;
  }
  const bool mma_ok = dsa_indexer_mma_supported(p);
  MX_CHECK_MSG(kernel != IndexerScoreKernel::kMma || mma_ok,
               "dsa_indexer_topk: the tensor-core score kernel needs a multiple of 16 index heads (<= 64) and a "
               "head_dim multiple of 16 within 48 KiB of tiles; got "
                   << p.n_heads << " heads x " << p.head_dim);
  if (kernel == IndexerScoreKernel::kAuto && !mma_ok)
    MX_WARN_ONCE << "dsa_indexer_topk: " << p.n_heads << " index heads x head_dim " << p.head_dim
                 << " is outside the tensor-core score kernel (multiple of 16 heads <= 64, head_dim multiple of 16); "
                    "running the slow SIMT score kernel (correct, one thread per key)";
  const bool aligned = reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(key_cache) % 16 == 0;
  MX_CHECK_MSG(kernel != IndexerScoreKernel::kMma || aligned,
               "dsa_indexer_topk: the tensor-core score kernel needs 16-byte aligned q and key_cache");
  if (kernel == IndexerScoreKernel::kAuto && mma_ok && !aligned)
    MX_WARN_ONCE << "dsa_indexer_topk: q or key_cache is not 16-byte aligned: running the slow SIMT score kernel";
  const bool use_mma = mma_ok && aligned && kernel != IndexerScoreKernel::kSimple;
  const int64_t row = std::max<int64_t>(max_ctx, 1) * 4;
  const int64_t group = std::min<int64_t>(static_cast<int64_t>(workspace_bytes) / row, 65535);
  MX_CHECK_MSG(group >= 1, "dsa_indexer_topk: workspace " << workspace_bytes << " bytes < one row of " << row);
  const size_t smem = dsa_indexer_smem_bytes(p);
  auto* codes = static_cast<uint32_t*>(workspace);
  for (int64_t t0 = 0; t0 < T; t0 += group) {
    const int64_t tg = std::min(group, T - t0);
    const dim3 grid(static_cast<unsigned>(ceil_div(max_ctx, kIdxKeys)), static_cast<unsigned>(tg));
    const auto* qb = static_cast<const bf16*>(q);
    const auto* wb = static_cast<const bf16*>(weights);
    const auto* kb = static_cast<const bf16*>(key_cache);
    if (use_mma) {
      const size_t msmem = scores_mma_smem_bytes(p);
      switch (p.n_heads / 16) {
        case 1:
          dsa_scores_mma_kernel<1><<<grid, kIdxKeys, msmem, stream>>>(qb, wb, kb, token_seq, kv_index, block_tables,
                                                                      codes, max_ctx, t0, p, ap);
          break;
        case 2:
          dsa_scores_mma_kernel<2><<<grid, kIdxKeys, msmem, stream>>>(qb, wb, kb, token_seq, kv_index, block_tables,
                                                                      codes, max_ctx, t0, p, ap);
          break;
        case 3:
          dsa_scores_mma_kernel<3><<<grid, kIdxKeys, msmem, stream>>>(qb, wb, kb, token_seq, kv_index, block_tables,
                                                                      codes, max_ctx, t0, p, ap);
          break;
        default:
          dsa_scores_mma_kernel<4><<<grid, kIdxKeys, msmem, stream>>>(qb, wb, kb, token_seq, kv_index, block_tables,
                                                                      codes, max_ctx, t0, p, ap);
          break;
      }
    } else {
      dsa_scores_kernel<<<grid, kIdxKeys, smem, stream>>>(qb, wb, kb, token_seq, kv_index, block_tables, codes,
                                                          max_ctx, t0, p, ap);
    }
    MX_CUDA_CHECK_LAUNCH();
    dsa_select_kernel<<<static_cast<unsigned>(tg), kSelThreads, 0, stream>>>(codes, max_ctx, t0, kv_index, topk,
                                                                              p.top_k);
    MX_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace mxserve::kernels::cuda
