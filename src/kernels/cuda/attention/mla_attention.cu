// Absorbed multi-head latent attention on CUDA (glm_moe_dsa), over the paged latent cache
// [latent (kv_lora_rank) | roped k_rope (qk_rope_dim)] per token, optionally restricted to the DSA
// indexer's top-k keys. Three kernels per group of tokens, all fp32 inside:
//   absorb:   q_abs[t, h, :] = q_nope[t, h, :] W_uk[h]       (W_uk = kv_b rows [h (nope+v), +nope))
//   attend:   o_lat[t, h, :] = softmax_j((q_abs . latent_j + q_rope . k_rope_j) * scale) latent_j
//   unabsorb: out[t, h, :]   = W_uv[h] o_lat[t, h, :]          (W_uv = kv_b rows [h (nope+v) + nope, +v))
// The same formula for prefill and decode (the CPU reference's, kernels/cpu/mla_dsa.cpp); only the
// latent + rope part is ever cached or read.
// The attend step runs the tensor-core kernel of mla_decode_mma.cu (all heads of a token share each latent
// tile, split-KV + combine) for the GLM-5.x shape, else the SIMT kernel here: one block per (token, head),
// 4 warps over keys with an online softmax each, lanes over the latent dims -- the oracle of the fast one.
// MlaAttendKernel::kWgmma / kWgmmaSplitS (forced, or kAuto once kMlaAutoHopperKernel names one) run the Hopper path
// instead: absorb and un-absorb as batched tensor-core GEMMs (mla_absorb_mma.cu, bf16 q_abs / o_lat in the same
// workspace regions) around the wgmma attend of mla_decode_wgmma.cu. Top-k rows of a large launch (prefill chunks:
// kMlaSparsePrefillMinTokens, once kMlaAutoSparsePrefill is on) or MlaAttendKernel::kWgmmaPrefill run the
// sparse-prefill attend of mla_sparse_prefill_wgmma.cu in its place (one CTA per token, no split-KV);
// kWgmmaPrefillEg (or kAuto once kMlaSparsePrefillEarlyGather is on) runs its early-gather schedule.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/attention/mla_fp8_load.cuh"
#include "kernels/cuda/attention/mla_visibility.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "core/logging.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kTokTile = 8;     // tokens per block of the absorb / unabsorb kernels (W read once per tile)
constexpr int kAttWarps = 4;    // warps per (token, head) in the attend kernel
constexpr int kPerLane = kMlaMaxLatent / 32;
constexpr int64_t kLatentBudget = int64_t{256} << 20;  // bytes of q_abs + o_lat per token group

__global__ void mla_absorb_kernel(const bf16* __restrict__ q, const bf16* __restrict__ kv_b, float* __restrict__ q_abs,
                                  int64_t n_tokens, int64_t t0, MlaParams p) {
  extern __shared__ float q_s[];  // [kTokTile][nope]
  const int h = blockIdx.x, NH = p.n_heads, NOPE = p.qk_nope_dim, L = p.kv_lora_rank;
  const int64_t q_stride = NOPE + p.qk_rope_dim, tl0 = static_cast<int64_t>(blockIdx.y) * kTokTile;
  for (int i = threadIdx.x; i < kTokTile * NOPE; i += blockDim.x) {
    const int64_t tl = tl0 + i / NOPE;
    q_s[i] = tl < n_tokens ? to_f32(q[((t0 + tl) * NH + h) * q_stride + i % NOPE]) : 0.f;
  }
  __syncthreads();
  const bf16* w_uk = kv_b + static_cast<int64_t>(h) * (NOPE + p.v_dim) * L;
  for (int c = threadIdx.x; c < L; c += blockDim.x) {
    float acc[kTokTile] = {};
    for (int d = 0; d < NOPE; ++d) {
      const float w = to_f32(w_uk[static_cast<int64_t>(d) * L + c]);
#pragma unroll
      for (int tt = 0; tt < kTokTile; ++tt) acc[tt] += q_s[tt * NOPE + d] * w;
    }
#pragma unroll
    for (int tt = 0; tt < kTokTile; ++tt)
      if (tl0 + tt < n_tokens) q_abs[((tl0 + tt) * NH + h) * L + c] = acc[tt];
  }
}

__global__ void mla_attend_kernel(const bf16* __restrict__ q, const float* __restrict__ q_abs,
                                  const void* __restrict__ cache, const int32_t* __restrict__ topk, int64_t topk_width,
                                  const int32_t* __restrict__ token_seq, const int32_t* __restrict__ kv_index,
                                  const int32_t* __restrict__ block_tables, float* __restrict__ o_lat, int64_t t0,
                                  MlaParams p, AttentionParams ap) {
  extern __shared__ float smem[];
  const int NH = p.n_heads, L = p.kv_lora_rank, R = p.qk_rope_dim;
  float* qa_s = smem;                  // [L]
  float* qr_s = qa_s + L;              // [R]
  float* comb = qr_s + R;              // [kAttWarps][L]
  float* stat = comb + kAttWarps * L;  // [kAttWarps][2]: running max, denominator
  const int64_t tl = blockIdx.x, t = t0 + tl;
  const int h = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* qa = q_abs + (tl * NH + h) * L;
  const bf16* qr = q + (t * NH + h) * (p.qk_nope_dim + R) + p.qk_nope_dim;
  for (int c = threadIdx.x; c < L; c += blockDim.x) qa_s[c] = qa[c];
  for (int r = threadIdx.x; r < R; r += blockDim.x) qr_s[r] = to_f32(qr[r]);
  __syncthreads();
  const MlaVisibility vis = mla_visibility(kv_index, ap, t);
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * ap.max_blocks_per_seq;
  const int64_t n_items = topk != nullptr ? topk_width : vis.n_ctx;
  // p.fp8_cache: packed FP8 rows (kernels/mla_fp8.h), read per element by mla_fp8_row_value.
  const int64_t row_width = p.fp8_cache ? mla_fp8_row_bytes(L, R) : L + R;
  float m = -INFINITY, l = 0.f, acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;
  for (int64_t i = warp; i < n_items; i += kAttWarps) {
    const int64_t j = topk != nullptr ? static_cast<int64_t>(topk[t * topk_width + i]) : i;
    if (!vis(j)) continue;  // warp-uniform
    const int64_t slot = mla_slot(table, j, ap.block_size);
    const bf16* row = static_cast<const bf16*>(cache) + slot * row_width;
    const uint8_t* row8 = static_cast<const uint8_t*>(cache) + slot * row_width;
    auto value = [&](int c) { return p.fp8_cache ? mla_fp8_row_value(row8, L, c) : to_f32(row[c]); };
    float lat[kPerLane], dot = 0.f;
#pragma unroll
    for (int ii = 0; ii < kPerLane; ++ii) {
      const int c = lane + 32 * ii;
      lat[ii] = c < L ? value(c) : 0.f;
      if (c < L) dot += qa_s[c] * lat[ii];
    }
    for (int r = lane; r < R; r += 32) dot += qr_s[r] * value(L + r);
    const float s = warp_sum(dot) * p.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), e = expf(s - m_new);
    l = l * corr + e;
#pragma unroll
    for (int ii = 0; ii < kPerLane; ++ii) acc[ii] = acc[ii] * corr + e * lat[ii];
    m = m_new;
  }
#pragma unroll
  for (int ii = 0; ii < kPerLane; ++ii) {
    const int c = lane + 32 * ii;
    if (c < L) comb[warp * L + c] = acc[ii];
  }
  if (lane == 0) {
    stat[2 * warp] = m;
    stat[2 * warp + 1] = l;
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttWarps; ++w) M = fmaxf(M, stat[2 * w]);
  float denom = 0.f, f[kAttWarps];
  for (int w = 0; w < kAttWarps; ++w) {
    f[w] = M == -INFINITY ? 0.f : expf(stat[2 * w] - M);  // a warp with no keys has m = -inf: weight 0
    denom += stat[2 * w + 1] * f[w];
  }
  float* o = o_lat + (tl * NH + h) * L;
  for (int c = threadIdx.x; c < L; c += blockDim.x) {
    float v = 0.f;
    for (int w = 0; w < kAttWarps; ++w) v += comb[w * L + c] * f[w];
    o[c] = denom > 0.f ? v / denom : 0.f;  // no visible key (cannot happen for a causal row): zeros, as the CPU
  }
}

__global__ void mla_unabsorb_kernel(const float* __restrict__ o_lat, const bf16* __restrict__ kv_b,
                                    bf16* __restrict__ out, int64_t n_tokens, int64_t t0, MlaParams p) {
  extern __shared__ float o_s[];  // [kTokTile][L]
  const int h = blockIdx.x, NH = p.n_heads, L = p.kv_lora_rank, V = p.v_dim;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t tl0 = static_cast<int64_t>(blockIdx.y) * kTokTile;
  for (int i = threadIdx.x; i < kTokTile * L; i += blockDim.x) {
    const int64_t tl = tl0 + i / L;
    o_s[i] = tl < n_tokens ? o_lat[(tl * NH + h) * L + i % L] : 0.f;
  }
  __syncthreads();
  const bf16* w_uv = kv_b + (static_cast<int64_t>(h) * (p.qk_nope_dim + V) + p.qk_nope_dim) * L;
  for (int e = warp; e < V; e += warps) {
    float acc[kTokTile] = {};
    for (int c = lane; c < L; c += 32) {
      const float w = to_f32(w_uv[static_cast<int64_t>(e) * L + c]);
#pragma unroll
      for (int tt = 0; tt < kTokTile; ++tt) acc[tt] += w * o_s[tt * L + c];
    }
#pragma unroll
    for (int tt = 0; tt < kTokTile; ++tt) {
      const float s = warp_sum(acc[tt]);
      if (lane == 0 && tl0 + tt < n_tokens) out[((t0 + tl0 + tt) * NH + h) * V + e] = to_bf16(s);
    }
  }
}

int64_t group_tokens(const MlaParams& p) {
  const int64_t per_token = 2 * static_cast<int64_t>(p.n_heads) * p.kv_lora_rank * 4;
  return std::max<int64_t>(1, std::min<int64_t>(kLatentBudget / per_token, 65535));  // grid dims
}

int64_t group_size(int64_t n_tokens, const MlaParams& p) {
  return std::min(std::max<int64_t>(n_tokens, 1), group_tokens(p));
}

// The Hopper path per token group: absorb GEMM (bf16 q_abs) -> wgmma attend (+ combine, bf16 o_lat) -> un-absorb
// GEMM. q_abs / o_lat reuse the fp32 regions of the SIMT path (half of each is used).
void mla_attention_wgmma_path(const void* q, const void* latent_cache, const void* kv_b, const int32_t* topk,
                              int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                              const int32_t* block_tables, void* out, const MlaParams& p, const AttentionParams& ap,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream, int wgmma_splits,
                              const AttentionSplitTable* wgmma_table, bool split_s, bool sparse_prefill,
                              bool prefill_early_gather);

}  // namespace

size_t mla_attention_workspace_bytes(int64_t n_tokens, const MlaParams& p, int wgmma_splits) {
  const int64_t group = group_size(n_tokens, p);
  const size_t simple = static_cast<size_t>(2 * group * p.n_heads * p.kv_lora_rank * 4);
  const size_t mma = mla_attend_mma_supported(p) ? mla_attend_mma_workspace_bytes(group, p) : 0;
  const size_t wgmma = mla_attend_wgmma_supported(p) ? mla_attend_wgmma_workspace_bytes(group, p, wgmma_splits) : 0;
  return simple + std::max(mma, wgmma);
}

void mla_attention_bf16(const void* q, const void* latent_cache, const void* kv_b, const int32_t* topk,
                        int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                        const int32_t* block_tables, void* out, const MlaParams& p, const AttentionParams& ap,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream, MlaAttendKernel kernel,
                        int wgmma_splits, const AttentionSplitTable* wgmma_table) {
  const int64_t T = ap.n_tokens;
  if (T == 0) return;
  const char* wgmma_why = nullptr;
  const bool forced_prefill = kernel == MlaAttendKernel::kWgmmaPrefill || kernel == MlaAttendKernel::kWgmmaPrefillEg;
  const bool forced_wgmma =
      kernel == MlaAttendKernel::kWgmma || kernel == MlaAttendKernel::kWgmmaSplitS || forced_prefill;
  const bool wgmma_ok =
      (forced_wgmma || (kMlaAutoWgmma && kernel == MlaAttendKernel::kAuto)) && mla_attend_wgmma_supported(p, &wgmma_why);
  MX_CHECK_MSG(!forced_wgmma || wgmma_ok,
               "mla_attention_bf16: the Hopper attend kernel (kWgmma / kWgmmaSplitS / kWgmmaPrefill[Eg]) cannot "
               "run: "
                   << wgmma_why);
  MX_CHECK_MSG(!forced_prefill || (topk != nullptr && !p.fp8_cache),
               "mla_attention_bf16: kWgmmaPrefill runs top-k (sparse) rows over a bf16 latent cache; got "
                   << (topk == nullptr ? "dense rows (no top-k list)" : "an FP8 cache"));
  if (wgmma_ok) {
    const MlaAttendKernel variant = forced_wgmma ? kernel : kMlaAutoHopperKernel;
    // Sparse prefill rows: the one-CTA-per-token attend once the launch is large enough to fill the SMs without
    // splitting the keys (kMlaSparsePrefillMinTokens).
    const bool sparse_prefill = forced_prefill || (kernel == MlaAttendKernel::kAuto && kMlaAutoSparsePrefill &&
                                                   topk != nullptr && !p.fp8_cache &&
                                                   T >= kMlaSparsePrefillMinTokens);
    mla_attention_wgmma_path(q, latent_cache, kv_b, topk, topk_width, token_seq, kv_index, block_tables, out, p, ap,
                             workspace, workspace_bytes, stream, wgmma_splits, wgmma_table,
                             variant == MlaAttendKernel::kWgmmaSplitS, sparse_prefill,
                             kernel == MlaAttendKernel::kWgmmaPrefillEg ||
                                 (kernel == MlaAttendKernel::kAuto && kMlaSparsePrefillEarlyGather));
    return;
  }
  const bool mma_ok = mla_attend_mma_supported(p);
  MX_CHECK_MSG(kernel != MlaAttendKernel::kMma || mma_ok,
               "mla_attention_bf16: the tensor-core attend kernel needs kv_lora_rank 512, qk_rope_dim 64 and 1..64 "
               "heads; got kv_lora_rank "
                   << p.kv_lora_rank << ", qk_rope_dim " << p.qk_rope_dim << ", " << p.n_heads << " heads");
  const bool use_mma = mma_ok && kernel != MlaAttendKernel::kSimple;
  if (kernel == MlaAttendKernel::kAuto && !mma_ok)
    MX_WARN_ONCE << "mla_attention: kv_lora_rank " << p.kv_lora_rank << ", qk_rope_dim " << p.qk_rope_dim << ", "
                 << p.n_heads << " heads: outside the tensor-core kernel (512 / 64 / <= 64 heads); running the slow "
                                 "SIMT attend kernel (correct, one head per block)";
  const int64_t per_token = static_cast<int64_t>(p.n_heads) * p.kv_lora_rank;
  const int64_t group = group_size(T, p);
  const size_t simple_bytes = static_cast<size_t>(2 * group * per_token * 4);
  MX_CHECK_MSG(workspace_bytes >= mla_attention_workspace_bytes(T, p),
               "mla_attention_bf16: workspace " << workspace_bytes << " bytes < "
                                                << mla_attention_workspace_bytes(T, p) << " for " << T << " tokens");
  float* q_abs = static_cast<float*>(workspace);
  float* o_lat = q_abs + group * per_token;
  void* parts = static_cast<char*>(workspace) + simple_bytes;
  const size_t parts_bytes = workspace_bytes - simple_bytes;
  // Splits are planned over the widest item range: the causal bound (dense) or the top-k list width.
  const int64_t max_items = topk != nullptr ? topk_width
                            : ap.max_kv_len > 0 ? ap.max_kv_len
                                                : static_cast<int64_t>(ap.max_blocks_per_seq) * ap.block_size;
  const auto* qb = static_cast<const bf16*>(q);
  const auto* kvb = static_cast<const bf16*>(kv_b);
  const size_t absorb_smem = sizeof(float) * kTokTile * p.qk_nope_dim;
  const size_t attend_smem = sizeof(float) * (p.kv_lora_rank + p.qk_rope_dim + kAttWarps * (p.kv_lora_rank + 2));
  const size_t unabsorb_smem = sizeof(float) * kTokTile * p.kv_lora_rank;
  for (int64_t t0 = 0; t0 < T; t0 += group) {
    const int64_t tg = std::min(group, T - t0);
    const dim3 tiles(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(ceil_div(tg, kTokTile)));
    mla_absorb_kernel<<<tiles, 256, absorb_smem, stream>>>(qb, kvb, q_abs, tg, t0, p);
    MX_CUDA_CHECK_LAUNCH();
    if (use_mma) {
      mla_attend_mma(q, q_abs, latent_cache, topk, topk_width, token_seq, kv_index, block_tables, o_lat, t0, tg,
                     max_items, p, ap, parts, parts_bytes, stream);
    } else {
      const dim3 heads(static_cast<unsigned>(tg), static_cast<unsigned>(p.n_heads));
      mla_attend_kernel<<<heads, kAttWarps * 32, attend_smem, stream>>>(
          qb, q_abs, latent_cache, topk, topk_width, token_seq, kv_index, block_tables,
          o_lat, t0, p, ap);
      MX_CUDA_CHECK_LAUNCH();
    }
    mla_unabsorb_kernel<<<tiles, 256, unabsorb_smem, stream>>>(o_lat, kvb, static_cast<bf16*>(out), tg, t0, p);
    MX_CUDA_CHECK_LAUNCH();
  }
}

namespace {

void mla_attention_wgmma_path(const void* q, const void* latent_cache, const void* kv_b, const int32_t* topk,
                              int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                              const int32_t* block_tables, void* out, const MlaParams& p, const AttentionParams& ap,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream, int wgmma_splits,
                              const AttentionSplitTable* wgmma_table, bool split_s, bool sparse_prefill,
                              bool prefill_early_gather) {
  const int64_t T = ap.n_tokens, per_token = static_cast<int64_t>(p.n_heads) * p.kv_lora_rank;
  const int64_t group = group_size(T, p);
  const size_t simple_bytes = static_cast<size_t>(2 * group * per_token * 4);
  MX_CHECK_MSG(workspace_bytes >= mla_attention_workspace_bytes(T, p, wgmma_splits),
               "mla_attention_bf16 (kWgmma): workspace " << workspace_bytes << " bytes < "
                                                         << mla_attention_workspace_bytes(T, p, wgmma_splits) << " for "
                                                         << T << " tokens, " << wgmma_splits << " forced splits");
  void* q_abs = workspace;
  void* o_lat = static_cast<char*>(workspace) + group * per_token * 4;
  void* parts = static_cast<char*>(workspace) + simple_bytes;
  const int64_t max_items = topk != nullptr ? topk_width
                            : ap.max_kv_len > 0 ? ap.max_kv_len
                                                : static_cast<int64_t>(ap.max_blocks_per_seq) * ap.block_size;
  for (int64_t t0 = 0; t0 < T; t0 += group) {
    const int64_t tg = std::min(group, T - t0);
    mla_absorb_gemm_bf16(q, kv_b, q_abs, t0, tg, p, stream);
    if (sparse_prefill) {
      mla_sparse_prefill_wgmma(q, q_abs, latent_cache, topk, topk_width, token_seq, kv_index, block_tables, o_lat, t0,
                               tg, p, ap, stream, kMlaSparsePrefillOverlapPv, prefill_early_gather);
    } else {
      mla_attend_wgmma(q, q_abs, latent_cache, topk, topk_width, token_seq, kv_index, block_tables, o_lat, t0, tg,
                       max_items, p, ap, parts, workspace_bytes - simple_bytes, stream, wgmma_splits, wgmma_table,
                       split_s);
    }
    mla_unabsorb_gemm_bf16(o_lat, kv_b, out, t0, tg, p, stream);
  }
}

}  // namespace

}  // namespace mxserve::kernels::cuda
