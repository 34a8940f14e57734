// Tensor-core attend step of absorbed MLA (glm_moe_dsa) over the paged latent cache, for decode and for
// the sparse (DSA top-k) path: o_lat[t, h, :] = softmax_j((q_abs . latent_j + q_rope . k_rope_j) * scale)
// latent_j, the same formula as the SIMT attend kernel of mla_attention.cu (kept as the oracle and the
// fallback for other shapes).
// Shape: kv_lora_rank 512, qk_rope_dim 64 (a cached row of 576 bf16), at most 64 heads (GLM-5.x).
// Layout: one CTA per (token, KV split) holds all heads of the token: the query rows [bf16(q_abs) | q_rope]
// sit in shared memory once; 32-key latent tiles stream through a 2-stage cp.async pipeline (gathered by
// block table, and by the top-k list in sparse mode), so every latent byte is read from HBM once per
// (token, split) and shared by all heads. Warp (head group hg of 16 heads, quarter qr) holds the query
// fragments of its 16 heads x dims [144 qr, +144) in registers for the whole kernel and computes the
// partial scores of those heads x all 32 keys of the tile over its 144 dims (mma.sync m16n8k16); the four
// partials are summed in shared memory (each warp sums 16 heads x 8 keys), then each warp runs the online
// softmax of its 16 heads over the 32 keys and accumulates P x latent[:, 128 qr, +128) (ldmatrix.trans of
// the same tile) in registers. Splitting the score's K dimension (not its keys) across the quarter warps
// keeps the query out of the per-tile shared-memory traffic, the limit of this design (see bench). Each split writes its
// normalized partial output and (max, denominator); a combine kernel merges the splits into o_lat.
// Precision: q_abs and the probabilities enter the MMAs as bf16 (fp32 accumulate, fp32 softmax), as
// production MLA kernels do; the op test states its tolerance against the fp32 CPU reference.
// FP8 latent cache (p.fp8_cache, kernels/mla_fp8.h: 656-byte rows): the raw rows stream through the same
// 2-stage cp.async pipeline into a staging buffer; after a tile lands, all threads dequantize it once into a
// single bf16 tile (mla_fp8_load.cuh), then the unchanged bf16 MMAs run: 0.57x the HBM bytes of bf16.
// Invisible keys (past the causal bound, outside a tree mask, -1 / out-of-range top-k entries) are
// zero-filled and masked to -inf, so a sparse set never widens the causal one (mla_visibility.cuh).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/attention/mla_fp8_load.cuh"
#include "kernels/cuda/attention/mla_visibility.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kLat = 512, kRope = 64, kRow = kLat + kRope;
constexpr int kRowPad = kRow + 8;  // 1168-byte smem rows: 8 consecutive rows hit distinct bank quads (ldmatrix)
constexpr int kTileKeys = 32;
constexpr int kSStride = kTileKeys + 4;
constexpr int kMaxHeadGroups = 4;  // 64 heads
constexpr int kQuarterDims = kRow / 4;  // 144: score K-dims per quarter warp (9 k-steps)
constexpr int kMinKeysPerSplit = 128;
constexpr int kMaxSplits = 256;
constexpr int kFp8Row = 656;  // mla_fp8_row_bytes(512, 64)
static_assert(kFp8Row == mla_fp8_row_bytes(kLat, kRope) && kFp8Row % 16 == 0 && mla_fp8_tail_offset(kLat) % 16 == 0);

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// FP8: one bf16 key tile (dequantized in place of the second) plus two staging tiles of raw 656-byte rows.
size_t attend_smem_bytes(int head_groups, bool fp8 = false) {
  return sizeof(bf16) * (static_cast<size_t>(head_groups) * 16 + (fp8 ? 1 : 2) * kTileKeys) * kRowPad +
         sizeof(float) * 4 * head_groups * 16 * kSStride + sizeof(int) * 2 * kTileKeys +
         (fp8 ? static_cast<size_t>(2) * kTileKeys * kFp8Row : 0);
}

// Grid (n_splits, tokens of the group); HG * 4 warps. part_o [tg, n_splits, NH, 512] (normalized by the
// split's denominator), part_ml [tg, n_splits, NH, 2] (running max, denominator; l = 0: no visible key).
// With one split part_o is o_lat itself (the same layout) and no combine runs.
template <int HG, bool kFp8>
__global__ void __launch_bounds__(HG * 128) mla_attend_mma_kernel(
    const bf16* __restrict__ q, const float* __restrict__ q_abs, const void* __restrict__ cache_raw,
    const int32_t* __restrict__ topk, int64_t topk_width, const int32_t* __restrict__ token_seq,
    const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables, float* __restrict__ part_o,
    float* __restrict__ part_ml, int64_t t0, int n_splits, int64_t keys_per_split, MlaParams p, AttentionParams ap) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw);                            // [HG * 16][kRowPad]
  bf16* k_s = q_s + HG * 16 * kRowPad;                                      // [2 (FP8: 1)][kTileKeys][kRowPad]
  // [4 quarters][HG * 16][kSStride] partial scores; quarter 0 then holds the summed, scaled, masked scores.
  float* s_s = reinterpret_cast<float*>(k_s + (kFp8 ? 1 : 2) * kTileKeys * kRowPad);
  int* valid_s = reinterpret_cast<int*>(s_s + 4 * HG * 16 * kSStride);  // [2][kTileKeys]
  uint8_t* raw_s = reinterpret_cast<uint8_t*>(valid_s + 2 * kTileKeys);   // FP8: [2][kTileKeys][kFp8Row]
  const bf16* cache = static_cast<const bf16*>(cache_raw);
  const uint8_t* cache8 = static_cast<const uint8_t*>(cache_raw);
  const int NH = p.n_heads, split = blockIdx.x;
  const int64_t tl = blockIdx.y, t = t0 + tl;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hg = warp >> 2, qr = warp & 3, g = lane >> 2, tig = lane & 3;

  const int64_t q_stride = p.qk_nope_dim + kRope;
  for (int i = tid; i < HG * 16 * (kRow / 2); i += blockDim.x) {
    const int h = i / (kRow / 2), c = 2 * (i % (kRow / 2));
    float a = 0.f, b = 0.f;
    if (h < NH) {
      if (c < kLat) {
        const float* src = q_abs + (tl * NH + h) * kLat + c;
        a = src[0];
        b = src[1];
      } else {
        const bf16* src = q + (t * NH + h) * q_stride + p.qk_nope_dim + (c - kLat);
        a = to_f32(src[0]);
        b = to_f32(src[1]);
      }
    }
    *reinterpret_cast<__nv_bfloat162*>(q_s + h * kRowPad + c) = __floats2bfloat162_rn(a, b);
  }

  const MlaVisibility vis = mla_visibility(kv_index, ap, t);
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * ap.max_blocks_per_seq;
  const int64_t n_items = topk != nullptr ? topk_width : vis.n_ctx;
  const int64_t begin = static_cast<int64_t>(split) * keys_per_split;
  // The last split also takes any tail past the planned bound (a max_kv_len that undercounts stays correct).
  const int64_t end = split == n_splits - 1 || n_items < begin + keys_per_split ? n_items : begin + keys_per_split;
  const int n_tiles = begin < end ? static_cast<int>((end - begin + kTileKeys - 1) / kTileKeys) : 0;

  auto load_tile = [&](int tile, int buf) {
    const int64_t base = begin + static_cast<int64_t>(tile) * kTileKeys;
    if constexpr (kFp8) {  // raw 656-byte rows, 41 16-byte chunks each, into the staging tile
      for (int i = tid; i < kTileKeys * (kFp8Row / 16); i += blockDim.x) {
        const int r = i / (kFp8Row / 16), c = i % (kFp8Row / 16);
        const int64_t item = base + r;
        int64_t j = -1;
        if (item < end) j = topk != nullptr ? static_cast<int64_t>(topk[t * topk_width + item]) : item;
        const bool ok = item < end && vis(j);
        const int jj = static_cast<int>(j);
        const uint8_t* src = ok ? cache8 + (static_cast<int64_t>(table[jj / ap.block_size]) * ap.block_size +
                                            jj % ap.block_size) * kFp8Row + c * 16
                                : cache8;
        cp_async_cg16_zfill(raw_s + (buf * kTileKeys + r) * kFp8Row + c * 16, src, ok);
        if (c == 0) valid_s[buf * kTileKeys + r] = ok ? 1 : 0;
      }
      cp_async_commit_group();
      return;
    }
    for (int i = tid; i < kTileKeys * (kRow / 8); i += blockDim.x) {
      const int r = i / (kRow / 8), c = i % (kRow / 8);
      const int64_t item = base + r;
      int64_t j = -1;
      if (item < end) j = topk != nullptr ? static_cast<int64_t>(topk[t * topk_width + item]) : item;
      const bool ok = item < end && vis(j);
      const int jj = static_cast<int>(j);  // < 2^31 keys: 32-bit division for the block lookup
      const bf16* src =
          ok ? cache + (static_cast<int64_t>(table[jj / ap.block_size]) * ap.block_size + jj % ap.block_size) * kRow + c * 8
             : cache;
      cp_async_cg16_zfill(k_s + (buf * kTileKeys + r) * kRowPad + c * 8, src, ok);
      if (c == 0) valid_s[buf * kTileKeys + r] = ok ? 1 : 0;
    }
    cp_async_commit_group();
  };

  float o[16][4];  // this warp's 16 heads x latent columns [128 qr, +128): n-tile n, C-fragment layout
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // rows g, g + 8 of the head group
  if (n_tiles > 0) load_tile(0, 0);
  __syncthreads();
  // A fragments of heads [16 hg, +16) x dims [144 qr, +144): held in registers below 64 heads; at 64 heads
  // (512 threads, 128 registers each) re-read from q_s per tile, each reused over the tile's 4 key n-tiles.
  constexpr bool kQInRegs = HG < 4;
  uint32_t qf[kQInRegs ? kQuarterDims / 16 : 1][4];
  const bf16* qa = q_s + (hg * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kRowPad + qr * kQuarterDims + 8 * (lane >> 4);
  if constexpr (kQInRegs) {
#pragma unroll
    for (int ks = 0; ks < kQuarterDims / 16; ++ks) ldsm_x4(qf[ks], qa + 16 * ks);
  }
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    if (tile + 1 < n_tiles) {
      load_tile(tile + 1, buf ^ 1);
      cp_async_wait_group<1>();
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();
    if constexpr (kFp8) {  // dequantize the landed staging tile into the one bf16 key tile (zero rows stay zero)
      for (int i = tid; i < kTileKeys * (kRow / 8); i += blockDim.x) {
        const int r = i / (kRow / 8), c = i % (kRow / 8);
        *reinterpret_cast<uint4*>(k_s + r * kRowPad + c * 8) =
            mla_fp8_row_chunk(raw_s + (buf * kTileKeys + r) * kFp8Row, kLat, c);
      }
      __syncthreads();
    }
    const int kbuf = kFp8 ? 0 : buf;  // the bf16 key tile the MMAs read
    {  // partial scores of heads [16 hg, +16) x the tile's 32 keys over dims [144 qr, +144)
      float c[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
      const bf16* kb = k_s + (kbuf * kTileKeys + (lane & 7) + 8 * (lane >> 4)) * kRowPad + qr * kQuarterDims +
                       8 * ((lane >> 3) & 1);
#pragma unroll
      for (int ks = 0; ks < kQuarterDims / 16; ++ks) {
        uint32_t a_tmp[4];
        if constexpr (!kQInRegs) ldsm_x4(a_tmp, qa + 16 * ks);
        const uint32_t(&a)[4] = kQInRegs ? qf[kQInRegs ? ks : 0] : a_tmp;
#pragma unroll
        for (int ntp = 0; ntp < 2; ++ntp) {
          uint32_t b[4];
          ldsm_x4(b, kb + 16 * ntp * kRowPad + 16 * ks);
          mma_bf16_m16n8k16(c[2 * ntp], a, b[0], b[1]);
          mma_bf16_m16n8k16(c[2 * ntp + 1], a, b[2], b[3]);
        }
      }
      float* part = s_s + (qr * HG * 16 + hg * 16 + g) * kSStride + 2 * tig;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        part[8 * nt] = c[nt][0];
        part[8 * nt + 1] = c[nt][1];
        part[8 * kSStride + 8 * nt] = c[nt][2];
        part[8 * kSStride + 8 * nt + 1] = c[nt][3];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // sum the quarters of heads [16 hg, +16) x keys [8 qr, +8), scale, mask
      const int e = lane + 32 * i, row = hg * 16 + e / 8, key = qr * 8 + e % 8;
      float* dst = s_s + row * kSStride + key;
      const float sum = dst[0] + dst[HG * 16 * kSStride] + dst[2 * HG * 16 * kSStride] + dst[3 * HG * 16 * kSStride];
      dst[0] = valid_s[buf * kTileKeys + key] != 0 ? sum * p.scale : -INFINITY;
    }
    __syncthreads();
    uint32_t pa[2][4];  // P as A fragments, 2 k-steps of 16 keys
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float* row = s_s + (hg * 16 + g + 8 * hr) * kSStride + 2 * tig;
      float s[8];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        s[4 * kk + 0] = row[16 * kk];
        s[4 * kk + 1] = row[16 * kk + 1];
        s[4 * kk + 2] = row[16 * kk + 8];
        s[4 * kk + 3] = row[16 * kk + 9];
      }
      float mx = s[0];
#pragma unroll
      for (int i = 1; i < 8; ++i) mx = fmaxf(mx, s[i]);
      const float m_new = fmaxf(m_run[hr], quad_max(mx));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float corr = __expf(m_run[hr] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        s[i] = __expf(s[i] - m_use);
        sum += s[i];
      }
      l_run[hr] = l_run[hr] * corr + quad_sum(sum);
      m_run[hr] = m_new;
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        o[n][2 * hr] *= corr;
        o[n][2 * hr + 1] *= corr;
      }
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        pa[kk][hr] = pack_bf16(s[4 * kk], s[4 * kk + 1]);          // a0 / a1: rows g / g + 8, keys 2 tig
        pa[kk][2 + hr] = pack_bf16(s[4 * kk + 2], s[4 * kk + 3]);  // a2 / a3: keys 2 tig + 8
      }
    }
    {  // o += P x latent[:, 128 qr, +128)
      const bf16* vb =
          k_s + (kbuf * kTileKeys + (lane & 7) + 8 * ((lane >> 3) & 1)) * kRowPad + qr * 128 + 8 * (lane >> 4);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          uint32_t b[4];
          ldsm_x4_trans(b, vb + 16 * kk * kRowPad + 16 * np);
          mma_bf16_m16n8k16(o[2 * np], pa[kk], b[0], b[1]);
          mma_bf16_m16n8k16(o[2 * np + 1], pa[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }

  const int64_t part = tl * n_splits + split;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int h = hg * 16 + g + 8 * hr;
    if (h >= NH) continue;
    const float inv = l_run[hr] > 0.f ? 1.f / l_run[hr] : 0.f;
    float* dst = part_o + (part * NH + h) * kLat + qr * 128 + 2 * tig;
#pragma unroll
    for (int n = 0; n < 16; ++n)
      *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[n][2 * hr] * inv, o[n][2 * hr + 1] * inv);
    if (qr == 0 && tig == 0) {
      part_ml[(part * NH + h) * 2] = m_run[hr];
      part_ml[(part * NH + h) * 2 + 1] = l_run[hr];
    }
  }
}

// Grid (tokens of the group, heads): o_lat[tl, h, :] = sum_s w_s o_s / sum_s w_s, w_s = l_s exp(m_s - M).
__global__ void mla_attend_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                          float* __restrict__ o_lat, int n_splits, int n_heads) {
  __shared__ float w_s[kMaxSplits];
  __shared__ float denom_s;
  const int64_t tl = blockIdx.x;
  const int h = blockIdx.y;
  const float* ml = part_ml + (tl * n_splits * n_heads + h) * 2;
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int s = 0; s < n_splits; ++s)
      if (ml[s * n_heads * 2 + 1] > 0.f) M = fmaxf(M, ml[s * n_heads * 2]);
    float denom = 0.f;
    for (int s = 0; s < n_splits; ++s) {
      const float l = ml[s * n_heads * 2 + 1];
      w_s[s] = l > 0.f ? l * expf(ml[s * n_heads * 2] - M) : 0.f;
      denom += w_s[s];
    }
    denom_s = denom;
  }
  __syncthreads();
  const float inv = denom_s > 0.f ? 1.f / denom_s : 0.f;  // no visible key (not for a causal row): zeros
  for (int c = threadIdx.x; c < kLat; c += blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < n_splits; ++s)
      if (w_s[s] != 0.f) v += w_s[s] * part_o[((tl * n_splits + s) * n_heads + h) * kLat + c];
    o_lat[(tl * n_heads + h) * kLat + c] = v * inv;
  }
}

int sm_count() {
  static std::atomic<int> cached{0};
  int n = cached.load();
  if (n == 0) {
    int dev = 0;
    MX_CUDA_CHECK(cudaGetDevice(&dev));
    MX_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cached.store(n);
  }
  return n;
}

template <int HG, bool kFp8>
void launch_attend(dim3 grid, cudaStream_t stream, const bf16* q, const float* q_abs, const void* cache,
                   const int32_t* topk, int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                   const int32_t* block_tables, float* part_o, float* part_ml, int64_t t0, int n_splits,
                   int64_t keys_per_split, const MlaParams& p, const AttentionParams& ap) {
  const size_t smem = attend_smem_bytes(HG, kFp8);
  static std::atomic<uint64_t> configured{0};  // one bit per device (the attribute is per device context)
  int dev = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if ((configured.load() & bit) == 0) {
    MX_CUDA_CHECK(cudaFuncSetAttribute(mla_attend_mma_kernel<HG, kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    configured.fetch_or(bit);
  }
  mla_attend_mma_kernel<HG, kFp8><<<grid, HG * 128, smem, stream>>>(q, q_abs, cache, topk, topk_width, token_seq, kv_index,
                                                              block_tables, part_o, part_ml, t0, n_splits,
                                                              keys_per_split, p, ap);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool mla_attend_mma_supported(const MlaParams& p) {
  return p.kv_lora_rank == kLat && p.qk_rope_dim == kRope && p.n_heads >= 1 && p.n_heads <= 16 * kMaxHeadGroups;
}

MlaSplitPlan mla_attend_split_plan(int64_t group_tokens, int64_t max_items) {
  MlaSplitPlan plan;
  const int64_t n_sm = sm_count();
  int64_t splits = 1;
  if (group_tokens < n_sm) {
    const int64_t by_keys = (std::max<int64_t>(max_items, 1) + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
    splits = std::clamp<int64_t>(std::min(n_sm / group_tokens, by_keys), 1, kMaxSplits);
  }
  const int64_t per = (std::max<int64_t>(max_items, 1) + splits - 1) / splits;
  plan.n_splits = static_cast<int>(splits);
  plan.keys_per_split = (per + kTileKeys - 1) / kTileKeys * kTileKeys;
  return plan;
}

// Several splits only when group_tokens < SMs, so group_tokens x n_splits <= SMs partial rows; one split
// writes o_lat directly and needs only the (max, denominator) pairs.
size_t mla_attend_mma_workspace_bytes(int64_t group_tokens, const MlaParams& p) {
  const int64_t split_parts = std::min<int64_t>(sm_count(), kMaxSplits);
  return std::max(static_cast<size_t>(split_parts) * p.n_heads * (kLat + 2),
                  static_cast<size_t>(group_tokens) * p.n_heads * 2) *
         sizeof(float);
}

void mla_attend_mma(const void* q, const float* q_abs, const void* latent_cache, const int32_t* topk,
                    int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index, const int32_t* block_tables,
                    float* o_lat, int64_t t0, int64_t group_tokens, int64_t max_items, const MlaParams& p,
                    const AttentionParams& ap, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (group_tokens == 0) return;
  const MlaSplitPlan plan = mla_attend_split_plan(group_tokens, max_items);
  const int64_t parts = group_tokens * plan.n_splits;
  const bool direct = plan.n_splits == 1;  // the kernel writes o_lat itself
  const size_t need = static_cast<size_t>(parts) * p.n_heads * ((direct ? 0 : kLat) + 2) * sizeof(float);
  MX_CHECK_MSG(need <= workspace_bytes, "mla_attend_mma: workspace " << workspace_bytes << " bytes < " << need
                                                                     << " for " << group_tokens << " tokens x "
                                                                     << plan.n_splits << " splits");
  float* part_o = direct ? o_lat : static_cast<float*>(workspace);
  float* part_ml = direct ? static_cast<float*>(workspace) : part_o + parts * p.n_heads * kLat;
  const dim3 grid(static_cast<unsigned>(plan.n_splits), static_cast<unsigned>(group_tokens));
  const auto* qb = static_cast<const bf16*>(q);
  // One launch per (head groups, cache dtype); FP8 rows are read raw (p.fp8_cache).
  auto launch = [&](auto hg, auto fp8) {
    launch_attend<decltype(hg)::value, decltype(fp8)::value>(grid, stream, qb, q_abs, latent_cache, topk, topk_width,
                                                             token_seq, kv_index, block_tables, part_o, part_ml, t0,
                                                             plan.n_splits, plan.keys_per_split, p, ap);
  };
  auto by_heads = [&](auto fp8) {
    switch ((p.n_heads + 15) / 16) {
      case 1: launch(std::integral_constant<int, 1>{}, fp8); break;
      case 2: launch(std::integral_constant<int, 2>{}, fp8); break;
      case 3: launch(std::integral_constant<int, 3>{}, fp8); break;
      default: launch(std::integral_constant<int, 4>{}, fp8); break;
    }
  };
  if (p.fp8_cache) by_heads(std::true_type{});
  else by_heads(std::false_type{});
  if (direct) return;
  const dim3 cgrid(static_cast<unsigned>(group_tokens), static_cast<unsigned>(p.n_heads));
  mla_attend_combine_kernel<<<cgrid, 128, 0, stream>>>(part_o, part_ml, o_lat, plan.n_splits, p.n_heads);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
