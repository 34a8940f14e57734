// The fused DSA indexer path on CUDA (IndexerScoreKernel::kFused): per query token t, score[j] =
// sum_h w[t, h] * weight_scale * ReLU(q[t, h] . key[j] * score_scale) over its visible keys, then the exact
// top-k (the CPU oracle's set and tie rule, kernels/dsa_topk_radix.h: ties to the lower KV index, written
// ascending, -1 padded). Three launches per group of tokens, no host sync, no allocation (the caller's
// workspace: codes [group, stride] u32 then hist [group, 4096] u32), so the decode step can be captured:
//  1. memset of the group's histograms;
//  2. score + histogram (dsa_score_hist_kernel): grid (blocks per token, tokens); a block walks a range of 128-key
//     tiles of one token (keys gathered through the block table by one templated stage function, cp.async
//     into a ring of 2 stages, or 2..4 by dsa_indexer_fused_stages), scores them on tensor cores (mma.sync bf16, fp32 accumulate, the ReLU-weighted
//     head sum in registers: the same arithmetic as the kMma kernel, so the same codes), writes the u32
//     order codes (4 bytes per 2 * head_dim key bytes) and adds their top 12 bits into a shared
//     histogram, flushed once per block into the token's histogram. Tiles per block are chosen so the
//     waves of resident blocks fill the SMs at any batch (batch 1, 20k keys: one tile per block on 160
//     blocks; batch 64: ~40 tiles per block in one wave);
//  3. select (dsa_select_fused_kernel): one block per token finds the threshold digit from that
//     histogram, refines bits [19:8] over the row (collecting the candidates into shared memory when
//     they fit) and bits [7:0] over the candidates, then writes the ordered selection in one scan.
// Rows whose context is <= top_k (decided per row on the device) skip the scores: the select writes
// their visible keys ascending (0..ctx-1 when no tree mask) and -1 padding.
// kFusedSplit replaces launch 3 by the cluster-split select (dsa_select_split.cu: 1..8 CTAs per token, the
// same codes, threshold and tie rule); with kDsaSplitOwnHist it also counts the first digit, so launch 1 and the
// score blocks' histogram are skipped (hist null). FP8 keys (p.fp8_keys, packed rows of kernels/mla_fp8.h): Fp8KeyLoad
// dequantizes each gathered row into the same bf16 tile the kMma path builds (mla_fp8_key_chunk), so both
// paths score the same bf16 values with the same MMAs and select the same set.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/attention/dsa_indexer_fused.h"
#include "kernels/cuda/attention/dsa_select_block.cuh"
#include "kernels/cuda/attention/mla_fp8_load.cuh"
#include "kernels/cuda/attention/mla_visibility.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/dsa_topk_radix.h"

namespace mxserve::kernels::cuda {
namespace {

namespace dsa = kernels::dsa;

constexpr int kTileKeys = 128;       // keys per tile (= threads of a score block, 4 warps x 32 keys)
constexpr int kSelectThreads = 1024; // threads of a select block
constexpr int kCandCap = 4096;       // candidates of the threshold digit kept in shared memory
constexpr int kPerThread = 8;        // codes per select thread per step of a pass over the row

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// The key load of the score loop: stages keys [j0, j0 + 128) of one sequence (block-table row `table`)
// into the bf16 tile k_s [128][D + 8], rows at or past n_ctx zero; asynchronous (cp.async groups), the
// caller commits and waits. One struct per key storage format: a format with kRaw stages its raw rows into
// raw_s and converts them into k_s in finish_tile (called after the wait, followed by a barrier).
struct Bf16KeyLoad {
  static constexpr bool kRaw = false;  // cp.async straight into the bf16 tile (no finish_tile)
  __device__ __forceinline__ static void stage_tile(bf16* k_s, uint8_t* /*raw_s*/, const void* cache,
                                                    const int32_t* table, int64_t j0, int64_t n_ctx, int D,
                                                    int block_size) {
    const auto* keys = static_cast<const bf16*>(cache);
    const int chunks = D / 8, pitch = D + 8;
    for (int i = threadIdx.x; i < kTileKeys * chunks; i += blockDim.x) {
      const int r = i / chunks, c = i % chunks;
      const int64_t j = j0 + r;
      const bool ok = j < n_ctx;
      const bf16* src = ok ? keys + mla_slot(table, j, block_size) * D + c * 8 : keys;
      cp_async_cg16_zfill(k_s + r * pitch + c * 8, src, ok);
    }
  }
};

// Packed FP8 rows (kernels/mla_fp8.h: head_dim e4m3 codes + one f32 scale per 128; 132 bytes at head_dim 128,
// 4-byte aligned only): the raw rows are copied by 4-byte cp.async into a raw stage (a ring of S, as the bf16
// tiles of bf16 keys), then finish_tile dequantizes them into the one bf16 tile (mla_fp8_key_chunk, the kMma path's
// dequantization: the same bf16 values, so the same scores).
struct Fp8KeyLoad {
  static constexpr bool kRaw = true;
  __device__ __forceinline__ static void stage_tile(bf16* /*k_s*/, uint8_t* raw_s, const void* cache,
                                                    const int32_t* table, int64_t j0, int64_t n_ctx, int D,
                                                    int block_size) {
    const auto* rows = static_cast<const uint8_t*>(cache);
    const int64_t rb = mla_fp8_row_bytes(D, 0);
    const int words = static_cast<int>(rb / 4);
    for (int i = threadIdx.x; i < kTileKeys * words; i += blockDim.x) {
      const int r = i / words, w = i % words;
      const int64_t j = j0 + r;
      const bool ok = j < n_ctx;
      const uint8_t* src = ok ? rows + mla_slot(table, j, block_size) * rb + 4 * w : rows;
      cp_async_ca4_zfill(raw_s + r * rb + 4 * w, src, ok);
    }
  }
  __device__ __forceinline__ static void finish_tile(bf16* k_s, const uint8_t* raw_s, int64_t j0, int64_t n_ctx,
                                                     int D) {
    const int chunks = D / 8, pitch = D + 8;
    const int64_t rb = mla_fp8_row_bytes(D, 0);
    for (int i = threadIdx.x; i < kTileKeys * chunks; i += blockDim.x) {
      const int r = i / chunks, c = i % chunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (j0 + r < n_ctx) v = mla_fp8_key_chunk(raw_s + r * rb, D, c);
      *reinterpret_cast<uint4*>(k_s + r * pitch + c * 8) = v;
    }
  }
};

// Shared memory of the score kernel with a ring of `stages` key loads: q, the bf16 key tiles (one per stage for
// bf16 keys; one for FP8 keys, whose stages are raw rows), the weights, the histogram, the FP8 raw stages.
size_t score_hist_smem_bytes(int mt, int D, bool fp8, int stages) {
  const size_t raw = fp8 ? static_cast<size_t>(stages * kTileKeys) * mla_fp8_row_bytes(D, 0) : 0;
  const int bf16_tiles = fp8 ? 1 : stages;
  return static_cast<size_t>(mt * 16 + bf16_tiles * kTileKeys) * (D + 8) * 2 + mt * 16 * 4 + dsa::kHistBins * 4 + raw;
}

// Grid (blocks per token, group tokens), kTileKeys threads. Block (s, tl) scores tiles [s * tiles_per_split, +tiles_per_split)
// of token t0 + tl (those below its context), writes codes[tl, j] for every j < n_ctx of those tiles (0 = not
// visible) and adds the visible codes' first digit into hist[tl, :] (hist null: no histogram, kDsaSplitOwnHist).
template <int MT, typename KeyLoad, int S>
__global__ void __launch_bounds__(kTileKeys) dsa_score_hist_kernel(
    const bf16* __restrict__ q, const bf16* __restrict__ weights, const void* __restrict__ key_cache,
    const int32_t* __restrict__ token_seq, const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
    uint32_t* __restrict__ codes, uint32_t* __restrict__ hist, int64_t stride, int64_t t0, int tiles_per_split,
    IndexerParams p, AttentionParams ap) {
  extern __shared__ __align__(16) unsigned char smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The split select (kDsaSplitPdl) may be scheduled now; it waits for this grid's completion before reading.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const int NH = p.n_heads, D = p.head_dim, pitch = D + 8;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s0 = q_s + MT * 16 * pitch;
  constexpr int kBf16Tiles = KeyLoad::kRaw ? 1 : S;  // raw formats convert every stage into one bf16 tile
  float* w_s = reinterpret_cast<float*>(k_s0 + kBf16Tiles * kTileKeys * pitch);
  uint32_t* h_s = reinterpret_cast<uint32_t*>(w_s + MT * 16);
  uint8_t* raw0 = reinterpret_cast<uint8_t*>(h_s + dsa::kHistBins);  // KeyLoad::kRaw: S stages of raw key rows
  const int64_t raw_stage = KeyLoad::kRaw ? kTileKeys * mla_fp8_row_bytes(D, 0) : 0;
  const int64_t tl = blockIdx.y, t = t0 + tl;
  const MlaVisibility vis = mla_visibility(kv_index, ap, t);
  const int64_t n_ctx = vis.n_ctx < stride ? vis.n_ctx : stride;
  if (n_ctx <= p.top_k) return;  // every visible key is selected: the select kernel writes the row
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * tiles_per_split;
  const int64_t tile_end = min(tile_begin + tiles_per_split, (n_ctx + kTileKeys - 1) / kTileKeys);
  if (tile_begin >= tile_end) return;
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * ap.max_blocks_per_seq;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  // The ring: tiles tile_begin + s in stage s (one cp.async group each, empty past tile_end), S - 1 ahead.
  for (int st = 0; st < S - 1; ++st) {
    if (tile_begin + st < tile_end)
      KeyLoad::stage_tile(k_s0 + (KeyLoad::kRaw ? 0 : st) * kTileKeys * pitch, raw0 + st * raw_stage, key_cache,
                          table, (tile_begin + st) * kTileKeys, n_ctx, D, ap.block_size);
    cp_async_commit_group();
  }
  const int chunks = D / 8;
  for (int i = tid; i < MT * 16 * chunks; i += blockDim.x) {
    const int h = i / chunks, c = i % chunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < NH) v = *reinterpret_cast<const uint4*>(q + (t * NH + h) * D + c * 8);
    *reinterpret_cast<uint4*>(q_s + h * pitch + c * 8) = v;
  }
  for (int h = tid; h < MT * 16; h += blockDim.x) w_s[h] = h < NH ? to_f32(weights[t * NH + h]) * p.weight_scale : 0.f;
  const bool with_hist = hist != nullptr;  // null: the split select counts the first digit itself
  for (int b = tid; with_hist && b < dsa::kHistBins; b += blockDim.x) h_s[b] = 0;
  uint32_t* row = codes + tl * stride;
  const bf16* qa = q_s + ((lane & 7) + 8 * ((lane >> 3) & 1)) * pitch + 8 * (lane >> 4);
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int it = static_cast<int>(tile - tile_begin), stage = it % S;
    if (tile + S - 1 < tile_end) {  // into the stage the previous iteration read (its trailing barrier)
      const int next = (it + S - 1) % S;
      KeyLoad::stage_tile(k_s0 + (KeyLoad::kRaw ? 0 : next) * kTileKeys * pitch, raw0 + next * raw_stage, key_cache,
                          table, (tile + S - 1) * kTileKeys, n_ctx, D, ap.block_size);
    }
    cp_async_commit_group();      // (empty past tile_end) so that S - 1 groups are always newer than this tile's
    cp_async_wait_group<S - 1>();
    __syncthreads();
    bf16* k_tile = k_s0 + (KeyLoad::kRaw ? 0 : stage) * kTileKeys * pitch;
    if constexpr (KeyLoad::kRaw) {  // raw rows of this tile -> the bf16 tile (the other stages keep loading)
      KeyLoad::finish_tile(k_tile, raw0 + stage * raw_stage, tile * kTileKeys, n_ctx, D);
      __syncthreads();
    }
    const bf16* k_s = k_tile;
    const bf16* kb = k_s + (warp * 32 + (lane & 7) + 8 * (lane >> 4)) * pitch + 8 * ((lane >> 3) & 1);
    float acc[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t b[2][4];
      ldsm_x4(b[0], kb + k0);
      ldsm_x4(b[1], kb + 16 * pitch + k0);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t a[4];
        ldsm_x4(a, qa + 16 * mt * pitch + k0);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          mma_bf16_m16n8k16(acc[mt][nt], a, b[nt / 2][2 * (nt % 2)], b[nt / 2][2 * (nt % 2) + 1]);
      }
    }
    const int64_t j0 = tile * kTileKeys;
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
        if (g == 0 && j < n_ctx) {
          const uint32_t code = vis(j) ? dsa::order_code(score) : 0u;
          row[j] = code;
          if (with_hist && code != 0) atomicAdd(&h_s[dsa::digit_of(code, 0)], 1u);
        }
      }
    }
    __syncthreads();  // the tile's buffer is restaged by the next iteration
  }
  if (!with_hist) return;
  uint32_t* hrow = hist + tl * dsa::kHistBins;
  for (int b = tid; b < dsa::kHistBins; b += blockDim.x)
    if (h_s[b] != 0) atomicAdd(&hrow[b], h_s[b]);
}

// One block (kSelectThreads) per token of the group: the exact top-k of codes[tl, 0..n_ctx) into topk[t, :].
__global__ void __launch_bounds__(kSelectThreads) dsa_select_fused_kernel(
    const uint32_t* __restrict__ codes, const uint32_t* __restrict__ hist_g, int64_t stride, int64_t t0,
    const int32_t* __restrict__ kv_index, AttentionParams ap, int32_t* __restrict__ topk, int K) {
  __shared__ uint32_t hist[dsa::kHistBins];
  __shared__ uint32_t cand[kCandCap];
  __shared__ uint32_t warp_u32[32], total_u32, n_cand;
  __shared__ unsigned long long warp_u64[32], total_u64;
  __shared__ dsa::RadixStep step_s;
  const int64_t tl = blockIdx.x, t = t0 + tl;
  const MlaVisibility vis = mla_visibility(kv_index, ap, t);
  const int64_t n = vis.n_ctx < stride ? vis.n_ctx : stride;
  const int tid = threadIdx.x, nt = blockDim.x;
  int32_t* out = topk + t * K;
  const uint32_t* row = codes + tl * stride;
  const bool skip = n <= K;  // every visible key is selected (the score kernel skipped this row)
  dsa::Threshold thr;        // code 0: keep every visible key
  if (!skip) {
    for (int b = tid; b < dsa::kHistBins; b += nt) hist[b] = hist_g[tl * dsa::kHistBins + b];
    if (tid == 0) n_cand = 0;
    __syncthreads();
    dsa::RadixStep s = block_radix_step(hist, dsa::kHistBins, static_cast<uint32_t>(K), warp_u32, &total_u32, &step_s);
    if (total_u32 > static_cast<uint32_t>(K)) {  // (uniform: read after the step's syncs)
      const uint32_t d0 = s.digit, in_d0 = hist[d0];
      thr.code = d0 << dsa::digit_shift(0);
      thr.ties = s.k_rem;
      const bool keep_cand = in_d0 <= static_cast<uint32_t>(kCandCap);
      __syncthreads();
      for (int b = tid; b < dsa::kHistBins; b += nt) hist[b] = 0;
      __syncthreads();
      // Pass 1: digit 1 of the codes whose digit 0 is d0 (over the row), collecting them when they fit.
      for (int64_t base = 0; base < n; base += kPerThread * static_cast<int64_t>(nt)) {
        uint32_t c[kPerThread];
#pragma unroll
        for (int u = 0; u < kPerThread; ++u) {
          const int64_t j = base + u * nt + tid;
          c[u] = j < n ? row[j] : 0u;
        }
#pragma unroll
        for (int u = 0; u < kPerThread; ++u) {
          if (c[u] == 0 || dsa::digit_of(c[u], 0) != d0) continue;
          atomicAdd(&hist[dsa::digit_of(c[u], 1)], 1u);
          if (keep_cand) {
            const uint32_t slot = atomicAdd(&n_cand, 1u);
            if (slot < kCandCap) cand[slot] = c[u];  // (always: pass 1 counts exactly hist[d0] <= kCandCap)
          }
        }
      }
      __syncthreads();
      s = block_radix_step(hist, dsa::digit_bins(1), thr.ties, warp_u32, &total_u32, &step_s);
      thr.code |= s.digit << dsa::digit_shift(1);
      thr.ties = s.k_rem;
      for (int b = tid; b < dsa::kHistBins; b += nt) hist[b] = 0;
      __syncthreads();
      // Pass 2: digit 2 of the codes matching the first 24 bits (the candidates, else the row again).
      const uint32_t mask = dsa::prefix_mask(2);
      if (keep_cand) {
        for (uint32_t i = tid; i < min(n_cand, static_cast<uint32_t>(kCandCap)); i += nt)
          if ((cand[i] & mask) == (thr.code & mask)) atomicAdd(&hist[dsa::digit_of(cand[i], 2)], 1u);
      } else {
        for (int64_t j = tid; j < n; j += nt) {
          const uint32_t c = row[j];
          if (c != 0 && (c & mask) == (thr.code & mask)) atomicAdd(&hist[dsa::digit_of(c, 2)], 1u);
        }
      }
      __syncthreads();
      s = block_radix_step(hist, dsa::digit_bins(2), thr.ties, warp_u32, &total_u32, &step_s);
      thr.code |= s.digit;
      thr.ties = s.k_rem;
    }
  }
  // Ordered compaction in tiles of 8 * nt keys, thread i owning keys [8 i, 8 i + 8) of the tile: a key is
  // kept at (kept keys above the threshold before it) + min(threshold ties before it, thr.ties).
  unsigned long long base_cnt = 0;  // (above << 32) | ties, over the earlier tiles
  uint32_t written = 0;
  for (int64_t tile = 0; tile < n; tile += kPerThread * static_cast<int64_t>(nt)) {
    uint32_t c[kPerThread];
    unsigned long long mine = 0;
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int64_t j = tile + kPerThread * tid + u;
      if (skip) c[u] = j < n && vis(j) ? 1u : 0u;  // thr.code 0: every visible key is "above"
      else c[u] = j < n ? row[j] : 0u;
      const bool above = c[u] > thr.code, tie = thr.code != 0 && c[u] == thr.code;
      mine += (static_cast<unsigned long long>(above) << 32) | (tie ? 1ull : 0ull);
    }
    const unsigned long long incl = block_inclusive_scan(mine, warp_u64, &total_u64);
    unsigned long long before = base_cnt + incl - mine;
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const uint32_t above_before = static_cast<uint32_t>(before >> 32), ties_before = static_cast<uint32_t>(before);
      const bool above = c[u] > thr.code, tie = thr.code != 0 && c[u] == thr.code;
      if (above || (tie && ties_before < thr.ties)) {
        const uint32_t pos = above_before + min(ties_before, thr.ties);
        if (pos < static_cast<uint32_t>(K)) out[pos] = static_cast<int32_t>(tile + kPerThread * tid + u);
      }
      before += (static_cast<unsigned long long>(above) << 32) | (tie ? 1ull : 0ull);
    }
    base_cnt += total_u64;
  }
  written = static_cast<uint32_t>(base_cnt >> 32) + min(static_cast<uint32_t>(base_cnt), thr.ties);
  for (int64_t i = static_cast<int64_t>(written) + tid; i < K; i += nt) out[i] = -1;
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

template <int MT, typename KeyLoad, int S>
void launch_score_hist(int64_t tg, size_t smem, cudaStream_t stream, const bf16* q, const bf16* w, const void* keys,
                       const int32_t* token_seq, const int32_t* kv_index, const int32_t* block_tables, uint32_t* codes,
                       uint32_t* hist, int64_t stride, int64_t t0, const IndexerParams& p, const AttentionParams& ap) {
  auto* kernel = dsa_score_hist_kernel<MT, KeyLoad, S>;
  // Per device and key format: the > 48 KiB opt-in (raised to the largest size seen) and the resident blocks
  // per SM at it.
  static std::atomic<size_t> configured[64];
  static std::atomic<int> per_sm[64];
  int dev = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  if (smem > configured[dev & 63].load()) {
    if (smem > 48 * 1024)
      MX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int n = 0;
    MX_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kTileKeys, smem));
    per_sm[dev & 63].store(std::max(n, 1));
    configured[dev & 63].store(smem);
  }
  const int64_t tiles = cdiv(stride, kTileKeys);
  const int tiles_per_block =
      dsa_indexer_fused_tiles_per_block(tg, tiles, static_cast<int64_t>(per_sm[dev & 63].load()) * sm_count());
  const dim3 grid(static_cast<unsigned>(cdiv(tiles, tiles_per_block)), static_cast<unsigned>(tg));
  kernel<<<grid, kTileKeys, smem, stream>>>(q, w, keys, token_seq, kv_index, block_tables, codes, hist, stride, t0,
                                            tiles_per_block, p, ap);
  MX_CUDA_CHECK_LAUNCH();
}

template <typename KeyLoad, int S>
void launch_score_hist_heads(int64_t tg, size_t smem, cudaStream_t stream, const bf16* q, const bf16* w,
                             const void* keys, const int32_t* token_seq, const int32_t* kv_index,
                             const int32_t* block_tables, uint32_t* codes, uint32_t* hist, int64_t stride, int64_t t0,
                             const IndexerParams& p, const AttentionParams& ap) {
  switch ((p.n_heads + 15) / 16) {
    case 1:
      launch_score_hist<1, KeyLoad, S>(tg, smem, stream, q, w, keys, token_seq, kv_index, block_tables, codes, hist,
                                    stride, t0, p, ap);
      break;
    case 2:
      launch_score_hist<2, KeyLoad, S>(tg, smem, stream, q, w, keys, token_seq, kv_index, block_tables, codes, hist,
                                    stride, t0, p, ap);
      break;
    case 3:
      launch_score_hist<3, KeyLoad, S>(tg, smem, stream, q, w, keys, token_seq, kv_index, block_tables, codes, hist,
                                    stride, t0, p, ap);
      break;
    default:
      launch_score_hist<4, KeyLoad, S>(tg, smem, stream, q, w, keys, token_seq, kv_index, block_tables, codes, hist,
                                    stride, t0, p, ap);
      break;
  }
}

template <typename KeyLoad>
void launch_score_hist_stages(int stages, int64_t tg, size_t smem, cudaStream_t stream, const bf16* q, const bf16* w,
                              const void* keys, const int32_t* token_seq, const int32_t* kv_index,
                              const int32_t* block_tables, uint32_t* codes, uint32_t* hist, int64_t stride, int64_t t0,
                              const IndexerParams& p, const AttentionParams& ap) {
  switch (stages) {
    case 3:
      launch_score_hist_heads<KeyLoad, 3>(tg, smem, stream, q, w, keys, token_seq, kv_index, block_tables, codes, hist,
                                          stride, t0, p, ap);
      break;
    case 4:
      launch_score_hist_heads<KeyLoad, 4>(tg, smem, stream, q, w, keys, token_seq, kv_index, block_tables, codes, hist,
                                          stride, t0, p, ap);
      break;
    default:
      launch_score_hist_heads<KeyLoad, 2>(tg, smem, stream, q, w, keys, token_seq, kv_index, block_tables, codes, hist,
                                          stride, t0, p, ap);
      break;
  }
}

std::atomic<int> g_forced_stages{0};

}  // namespace

void dsa_indexer_fused_force_stages(int stages) { g_forced_stages.store(stages); }

int dsa_indexer_fused_stages(const IndexerParams& p, int64_t group_tokens, int64_t max_ctx, int sm_count,
                             int forced) {
  const int64_t tiles = std::max<int64_t>(group_tokens, 1) * cdiv(std::max<int64_t>(max_ctx, 1), kTileKeys);
  int stages = forced > 0 ? forced : (kFusedDeepStages > 0 && tiles >= int64_t{8} * std::max(sm_count, 1)
                                          ? kFusedDeepStages
                                          : 2);
  stages = std::clamp(stages, 2, kFusedMaxStages);
  const int mt = (p.n_heads + 15) / 16;
  while (stages > 2 && score_hist_smem_bytes(mt, p.head_dim, p.fp8_keys, stages) > static_cast<size_t>(kFusedMaxSmem))
    --stages;
  return stages;
}

size_t dsa_indexer_fused_smem_bytes(const IndexerParams& p, int stages) {
  return score_hist_smem_bytes(std::min((p.n_heads + 15) / 16, 4), p.head_dim, p.fp8_keys, stages);
}

bool dsa_indexer_fused_supported(const IndexerParams& p) {
  // Heads are padded to a multiple of 16 with zero q rows and zero weights (each adds exactly +0 to a score).
  // FP8 keys (packed rows, kernels/mla_fp8.h): head_dim % 16 == 0 keeps the rows' f32 scales 4-byte aligned.
  return p.n_heads >= 1 && p.n_heads <= 64 && p.head_dim >= 16 && p.head_dim % 16 == 0 && p.top_k >= 1 &&
         dsa_indexer_fused_smem_bytes(p) <= static_cast<size_t>(kFusedMaxSmem);
}

size_t dsa_indexer_fused_row_bytes(int64_t max_ctx) {
  return static_cast<size_t>(std::max<int64_t>(max_ctx, 1) + dsa::kHistBins) * 4;
}

int dsa_indexer_fused_tiles_per_block(int64_t group_tokens, int64_t tiles, int64_t resident_blocks) {
  // The makespan in tile times: waves of resident blocks x (tiles per block + ~half a tile of per-block
  // set-up: q, the histogram's zeroing and flush). Batch 1 at 20k keys: 1 tile per block over 160 blocks;
  // batch 64: ~40 tiles per block in one wave.
  const int64_t T = std::max<int64_t>(group_tokens, 1), cap = std::max<int64_t>(resident_blocks, 1);
  tiles = std::max<int64_t>(tiles, 1);
  int64_t best = 1;
  double best_cost = 1e300;
  for (int64_t tpb = 1; tpb <= tiles; tpb = tpb < 64 ? tpb + 1 : tpb + tpb / 8) {
    const double cost = static_cast<double>(cdiv(T * cdiv(tiles, tpb), cap)) * (static_cast<double>(tpb) + 0.5);
    if (cost < best_cost) {
      best_cost = cost;
      best = tpb;
    }
  }
  return static_cast<int>(best);
}

void dsa_indexer_topk_fused(const void* q, const void* weights, const void* key_cache, const int32_t* token_seq,
                            const int32_t* kv_index, const int32_t* block_tables, int32_t* topk,
                            const IndexerParams& p, const AttentionParams& ap, int64_t max_ctx, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream, bool split_select) {
  const int64_t T = ap.n_tokens;
  if (T == 0) return;
  MX_CHECK_MSG(dsa_indexer_fused_supported(p), "dsa_indexer_topk (fused): " << p.n_heads << " index heads x head_dim "
                                                   << p.head_dim << ", top_k " << p.top_k
                                                   << " (1..64 heads, head_dim a multiple of 16, top_k >= 1)");
  MX_CHECK_MSG(reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(key_cache) % (p.fp8_keys ? 4 : 16) == 0,
               "dsa_indexer_topk (fused): q must be 16-byte aligned, key_cache " << (p.fp8_keys ? 4 : 16)
                                                                                 << "-byte aligned");
  const int64_t stride = std::max<int64_t>(max_ctx, 1);
  const int64_t row = static_cast<int64_t>(dsa_indexer_fused_row_bytes(max_ctx));
  const int64_t group = std::min<int64_t>(static_cast<int64_t>(workspace_bytes) / row, 65535);
  MX_CHECK_MSG(group >= 1, "dsa_indexer_topk (fused): workspace " << workspace_bytes << " bytes < one row of " << row);
  const auto* qb = static_cast<const bf16*>(q);
  const auto* wb = static_cast<const bf16*>(weights);
  for (int64_t t0 = 0; t0 < T; t0 += group) {
    const int64_t tg = std::min(group, T - t0);
    auto* codes = static_cast<uint32_t*>(workspace);
    // The split select with its own first-digit count needs no histogram (no memset, no flush in the score blocks).
    const bool own_hist = split_select && kDsaSplitOwnHist;
    uint32_t* hist = own_hist ? nullptr : codes + tg * stride;
    if (!own_hist) MX_CUDA_CHECK(cudaMemsetAsync(hist, 0, static_cast<size_t>(tg) * dsa::kHistBins * 4, stream));
    const int stages = dsa_indexer_fused_stages(p, tg, stride, sm_count(), g_forced_stages.load());
    const size_t smem = dsa_indexer_fused_smem_bytes(p, stages);
    if (p.fp8_keys) launch_score_hist_stages<Fp8KeyLoad>(stages, tg, smem, stream, qb, wb, key_cache, token_seq,
                                                          kv_index, block_tables, codes, hist, stride, t0, p, ap);
    else launch_score_hist_stages<Bf16KeyLoad>(stages, tg, smem, stream, qb, wb, key_cache, token_seq, kv_index,
                                               block_tables, codes, hist, stride, t0, p, ap);
    if (split_select) {
      dsa_select_split_launch(codes, hist, stride, t0, tg, kv_index, ap, topk, p.top_k,
                              dsa_select_split_ctas(tg, stride, sm_count()), stream);
      continue;
    }
    dsa_select_fused_kernel<<<static_cast<unsigned>(tg), kSelectThreads, 0, stream>>>(codes, hist, stride, t0,
                                                                                     kv_index, ap, topk, p.top_k);
    MX_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace mxserve::kernels::cuda
