// Paged causal GQA attention on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), FA2-style:
// one warp per (token, kv head, context split). The warp's 16 MMA rows are the token's query heads of
// that kv head (G <= 16, padded with zero rows), so decode gets tensor cores through GQA and every
// K/V tile is read once per head group. Keys stream through a private 3-stage cp.async pipeline of
// 16-key tiles; S = Q K^T stays in registers, the online softmax runs on the accumulator fragments
// and P (rounded to bf16) feeds the P V product directly as the A operand.
// Invariants: as the CUDA-core kernel (paged_attention.cu): token t attends to [0, kv_index[t]];
// split partials use the same workspace layout, merged by the same combine kernel.
// Two kernels share the per-tile math (process_tile): the per-warp one above for decode-like batches,
// and a block-shared one for prefill-like batches (8 tokens per block share each 64-key K/V tile).
// FP8 E4M3 caches (p.k_scales set): the raw codes and scales go through the same cp.async pipeline (kv_fp8_tile.cuh)
// and each landed stage is dequantized into one bf16 tile in shared memory; everything after is the bf16 path.
// The old loader (plain loads dequantized in registers, bf16 stores) stays selectable: kv_fp8_load_mode.h.
// NOTE: mma.sync (HMMA), not wgmma: Hopper's warpgroup MMA with TMA loads is the next step for
// prefill. ldmatrix / mma.sync / cp.async are the sm_80+ seam; a HIP port maps them to MFMA.
#include <cuda_bf16.h>

#include <climits>
#include <cmath>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/logging.h"
#include "kernels/cuda/attention/kv_fp8_load.cuh"
#include "kernels/cuda/attention/kv_fp8_load_mode.h"
#include "kernels/cuda/attention/kv_fp8_tile.cuh"
#include "kernels/cuda/attention/paged_attention_mma.h"
#include "kernels/cuda/attention/paged_attention_mma_tile.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

using namespace mma_tile;  // the shared per-tile math (paged_attention_mma_tile.cuh)

constexpr int kWarps = 4;        // per-warp kernel: warps per block
constexpr int kKeys = 16;         // per-warp kernel: keys per tile
constexpr int kSharedWarps = 8;   // shared kernel: tokens (warps) per block
constexpr int kSharedKeys = 64;   // shared kernel: keys per tile
constexpr int kStages = 3;

template <int HD, KvLoad L>
constexpr size_t smem_per_warp() {
  return kv_pipeline_bytes<HD, kKeys, L>(kStages);
}

// Final output (n_splits == 1) or this split's partial (max, sum, unnormalized O) into workspace.
template <int HD>
__device__ __forceinline__ void write_result(WarpState<HD>& st, int64_t t, int kvh, int split, int n_splits, int G,
                                             const AttentionParams& p, bf16* out, float* ws, int lane) {
  constexpr int NT = HD / 8;
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    st.l[hr] += __shfl_xor_sync(0xffffffffu, st.l[hr], 1);
    st.l[hr] += __shfl_xor_sync(0xffffffffu, st.l[hr], 2);
  }
  const int64_t n_parts = static_cast<int64_t>(p.n_tokens) * p.n_heads * n_splits;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = g + 8 * hr;
    if (row >= G) continue;
    const int64_t head_row = t * p.n_heads + static_cast<int64_t>(kvh) * G + row;
    if (n_splits == 1) {
      const float inv = st.l[hr] > 0.f ? 1.f / st.l[hr] : 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
        *reinterpret_cast<uint32_t*>(out + head_row * HD + n * 8 + 2 * tq) =
            pack_bf16(st.o[n][2 * hr] * inv, st.o[n][2 * hr + 1] * inv);
    } else {
      const int64_t part = head_row * n_splits + split;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        ws[part * HD + n * 8 + 2 * tq] = st.o[n][2 * hr];
        ws[part * HD + n * 8 + 2 * tq + 1] = st.o[n][2 * hr + 1];
      }
      if (tq == 0) {
        ws[n_parts * HD + part] = st.m[hr];
        ws[n_parts * (HD + 1) + part] = st.l[hr];
      }
    }
  }
}

// Decode-style kernel: each warp owns one (token, kv head, split) and a private pipeline of 16-key tiles.
template <int HD, KvLoad kLoad>  // the tile loader (kv_fp8_tile.cuh), a template parameter (see launch)
__global__ void __launch_bounds__(kWarps * 32)
    paged_attention_mma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                               const bf16* __restrict__ v_cache, const int32_t* __restrict__ token_seq,
                               const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                               bf16* __restrict__ out, float* __restrict__ ws, AttentionParams p, int n_splits,
                               int split_len, int64_t n_items) {
  constexpr int R = row_stride<HD>();
  constexpr int CH = HD / 8;  // 16-byte chunks per K/V row
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= n_items) return;  // warps are independent: no block-wide barrier below
  bf16* wsm = reinterpret_cast<bf16*>(smem) + static_cast<size_t>(warp) * kStages * 2 * kKeys * R;
  unsigned char* fp8_region = smem + static_cast<size_t>(warp) * smem_per_warp<HD, kLoad>();  // kFp8Async only

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
  const int tbase = p.tree_mask != nullptr ? p.tree_base[t] : INT_MAX;  // tree rows (AttentionParams)
  const uint64_t tmask = p.tree_mask != nullptr ? p.tree_mask[t] : 0ull;

  uint32_t qa[HD / 16][4];
  load_q<HD>(q + (t * p.n_heads + static_cast<int64_t>(kvh) * G) * HD, G, lane, qa);

  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kKeys - 1) / kKeys : 0;
  auto load_tile = [&](int stage, int tile) {
    bf16* kd = wsm + stage * 2 * kKeys * R;
    bf16* vd = kd + kKeys * R;
    const int k0 = kv_begin + tile * kKeys;
    if constexpr (kLoad == KvLoad::kFp8Async) {  // raw codes + scales into the stage (kv_fp8_tile.cuh)
      fp8_tile_issue<HD, kKeys, 32>(fp8_region + stage * Fp8Stage<HD, kKeys>::kBytes, lane, k_cache, v_cache, kvh, p,
                                    [&](int j) {
                                      const int key = k0 + j;  // tree-masked keys zero-filled, as below
                                      return table_slot_or_none(
                                          key < kv_end && (key < tbase || ((tmask >> (key - tbase)) & 1ull) != 0), key,
                                          table, p.block_size);
                                    });
    } else {
#pragma unroll
      for (int c = lane; c < kKeys * CH; c += 32) {
        const int j = c / CH, d = (c % CH) * 8;
        const int key = k0 + j;
        // Tree-masked keys are zero-filled like those past the end (never 0 * NaN from a stale slot).
        const bool ok = key < kv_end && (key < tbase || ((tmask >> (key - tbase)) & 1ull) != 0);
        int64_t off = 0, slot = 0;
        if (ok) {
          slot = static_cast<int64_t>(table[key / p.block_size]) * p.block_size + key % p.block_size;
          off = slot * kv_width + kvh * HD + d;
        }
        if constexpr (kLoad == KvLoad::kFp8Plain) {  // FP8 cache: codes dequantized in registers, stored as bf16
          uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;
          if (ok) load_fp8_kv_chunk(k_cache, v_cache, off, slot, kvh, p, kr, vr);
          *reinterpret_cast<uint4*>(kd + j * R + d) = kr;
          *reinterpret_cast<uint4*>(vd + j * R + d) = vr;
          continue;
        }
        cp_async16(kd + j * R + d, k_cache + off, ok);  // invalid keys are zero-filled: finite, then masked
        cp_async16(vd + j * R + d, v_cache + off, ok);
      }
    }
  };

  WarpState<HD> st;
  init_state(st);
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
    if constexpr (kLoad == KvLoad::kFp8Async) {  // the landed stage -> the bf16 tile (free: the wait above)
      bf16* dq = fp8_dequant_tile<HD, kKeys>(fp8_region, kStages);
      fp8_tile_dequant<HD, kKeys, 32>(fp8_region + (it % kStages) * Fp8Stage<HD, kKeys>::kBytes, dq, dq + kKeys * R,
                                      lane);
      __syncwarp();
      kd = dq;
    }
    process_tile<HD, kKeys>(kd, kd + kKeys * R, kv_begin + it * kKeys, kv_end, p.scale, qa, st, lane, tbase, tmask);
  }
  cp_async_wait<0>();
  write_result<HD>(st, t, kvh, split, n_splits, G, p, out, ws, lane);
}

// Prefill-style kernel: a block of kSharedWarps warps serves kSharedWarps consecutive tokens of one kv head;
// K/V tiles of kSharedKeys keys are loaded once into shared memory for all of them (kSharedWarps x the
// reuse of the per-warp kernel). Tokens of different sequences in one block are served one sequence
// after the other (warps of other sequences skip the math but keep the barriers).
template <int HD, KvLoad kLoad>
__global__ void __launch_bounds__(kSharedWarps * 32)
    paged_attention_mma_shared_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                                      const bf16* __restrict__ v_cache, const int32_t* __restrict__ token_seq,
                                      const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                                      bf16* __restrict__ out, float* __restrict__ ws, AttentionParams p, int n_splits,
                                      int split_len) {
  constexpr int R = row_stride<HD>();
  constexpr int CH = HD / 8;
  constexpr int KEYS = kSharedKeys;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int seq_s[kSharedWarps], end_s[kSharedWarps];
  bf16* tiles = reinterpret_cast<bf16*>(smem);  // [kStages][K | V][KEYS][R]
  // kFp8Async: [kStages][raw stage] then the bf16 tile (kv_fp8_tile.cuh)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kSharedWarps;
  if (threadIdx.x < kSharedWarps) {
    const int64_t tt = t0 + threadIdx.x;
    seq_s[threadIdx.x] = tt < p.n_tokens ? token_seq[tt] : -1;
    end_s[threadIdx.x] = tt < p.n_tokens ? kv_index[tt] + 1 : 0;
  }
  __syncthreads();
  const int64_t t = t0 + warp;
  const bool has_token = t < p.n_tokens;
  const int G = p.n_heads / p.n_kv_heads;
  const int64_t kv_width = static_cast<int64_t>(p.n_kv_heads) * HD;
  const int kv_begin = split * split_len;
  const int my_seq = seq_s[warp];
  const int my_end = min(end_s[warp], kv_begin + split_len);

  uint32_t qa[HD / 16][4];
  if (has_token) load_q<HD>(q + (t * p.n_heads + static_cast<int64_t>(kvh) * G) * HD, G, lane, qa);
  WarpState<HD> st;
  init_state(st);

  for (int w0 = 0; w0 < kSharedWarps; ++w0) {  // each distinct sequence of the block, in order
    const int sq = seq_s[w0];
    if (sq < 0) break;
    bool seen = false;
    int end = 0;
    for (int w1 = 0; w1 < kSharedWarps; ++w1) {
      if (seq_s[w1] != sq) continue;
      if (w1 < w0) seen = true;
      end = max(end, end_s[w1]);
    }
    if (seen) continue;
    const int kv_end = min(end, kv_begin + split_len);
    const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + KEYS - 1) / KEYS : 0;
    const int32_t* table = block_tables + static_cast<int64_t>(sq) * p.max_blocks_per_seq;
    const bool mine = has_token && my_seq == sq;
    auto load_tile = [&](int stage, int tile) {
      bf16* kd = tiles + stage * 2 * KEYS * R;
      bf16* vd = kd + KEYS * R;
      const int k0 = kv_begin + tile * KEYS;
      if constexpr (kLoad == KvLoad::kFp8Async) {
        fp8_tile_issue<HD, KEYS, kSharedWarps * 32>(
            smem + stage * Fp8Stage<HD, KEYS>::kBytes, threadIdx.x, k_cache, v_cache, kvh, p,
            [&](int j) { return table_slot_or_none(k0 + j < kv_end, k0 + j, table, p.block_size); });
      } else {
        for (int c = threadIdx.x; c < KEYS * CH; c += kSharedWarps * 32) {
          const int j = c / CH, d = (c % CH) * 8;
          const int key = k0 + j;
          const bool ok = key < kv_end;
          int64_t off = 0, slot = 0;
          if (ok) {
            slot = static_cast<int64_t>(table[key / p.block_size]) * p.block_size + key % p.block_size;
            off = slot * kv_width + kvh * HD + d;
          }
          if constexpr (kLoad == KvLoad::kFp8Plain) {  // FP8 cache: codes dequantized in registers, stored as bf16
            uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;
            if (ok) load_fp8_kv_chunk(k_cache, v_cache, off, slot, kvh, p, kr, vr);
            *reinterpret_cast<uint4*>(kd + j * R + d) = kr;
            *reinterpret_cast<uint4*>(vd + j * R + d) = vr;
            continue;
          }
          cp_async16(kd + j * R + d, k_cache + off, ok);
          cp_async16(vd + j * R + d, v_cache + off, ok);
        }
      }
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_tiles) load_tile(s, s);
      cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      if (it + kStages - 1 < n_tiles) load_tile((it + kStages - 1) % kStages, it + kStages - 1);
      cp_async_commit();
      const int k0 = kv_begin + it * KEYS;
      if constexpr (kLoad == KvLoad::kFp8Async) {  // every thread: the landed stage -> the bf16 tile
        bf16* dq = fp8_dequant_tile<HD, KEYS>(smem, kStages);
        fp8_tile_dequant<HD, KEYS, kSharedWarps * 32>(smem + (it % kStages) * Fp8Stage<HD, KEYS>::kBytes, dq,
                                                      dq + KEYS * R, threadIdx.x);
        __syncthreads();
      }
      if (mine && k0 < my_end) {
        const bf16* kd = kLoad == KvLoad::kFp8Async ? fp8_dequant_tile<HD, KEYS>(smem, kStages)
                                                    : tiles + (it % kStages) * 2 * KEYS * R;
        process_tile<HD, KEYS>(kd, kd + KEYS * R, k0, my_end, p.scale, qa, st, lane);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the stages are reused by the next sequence
  }
  if (has_token) write_result<HD>(st, t, kvh, split, n_splits, G, p, out, ws, lane);
}

template <int HD, KvLoad kLoad>
void launch_t(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
              const int32_t* kv_index, const int32_t* block_tables, void* out, const AttentionParams& p, int n_splits,
              int split_len, void* workspace, cudaStream_t stream) {
  const size_t smem = kWarps * smem_per_warp<HD, kLoad>();
  static bool configured = false;  // NOTE: > 48 KB of dynamic shared memory needs an opt-in, once
  if (!configured) {
    MX_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_mma_kernel<HD, kLoad>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    configured = true;
  }
  const int64_t items = static_cast<int64_t>(p.n_tokens) * p.n_kv_heads * n_splits;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  MX_CHECK_LT(blocks, int64_t{1} << 31);
  paged_attention_mma_kernel<HD, kLoad><<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k_cache), static_cast<const bf16*>(v_cache), token_seq,
      kv_index, block_tables, static_cast<bf16*>(out), static_cast<float*>(workspace), p, n_splits, split_len, items);
  MX_CUDA_CHECK_LAUNCH();
}

template <int HD, KvLoad kLoad>
void launch_shared_t(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                     const int32_t* kv_index, const int32_t* block_tables, void* out, const AttentionParams& p,
                     int n_splits, int split_len, void* workspace, cudaStream_t stream) {
  const size_t smem = kv_pipeline_bytes<HD, kSharedKeys, kLoad>(kStages);
  static bool configured = false;  // NOTE: > 48 KB of dynamic shared memory needs an opt-in, once
  if (!configured) {
    MX_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_mma_shared_kernel<HD, kLoad>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>((p.n_tokens + kSharedWarps - 1) / kSharedWarps), p.n_kv_heads, n_splits);
  paged_attention_mma_shared_kernel<HD, kLoad><<<grid, kSharedWarps * 32, smem, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k_cache), static_cast<const bf16*>(v_cache), token_seq,
      kv_index, block_tables, static_cast<bf16*>(out), static_cast<float*>(workspace), p, n_splits, split_len);
  MX_CUDA_CHECK_LAUNCH();
}

// The bf16 and FP8-cache instantiations of both kernels, chosen by whether the params carry FP8 scales (and the
// FP8 loader, kv_fp8_load_mode.h): a runtime FP8 branch in the tile loads is the suspect for the bf16 decode
// kernel's 13% slowdown measured on the H200 when the FP8 cache landed (docs/perf/decode-path.md).
template <int HD>
void launch(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
            const int32_t* kv_index, const int32_t* block_tables, void* out, const AttentionParams& p, int n_splits,
            int split_len, void* workspace, cudaStream_t stream) {
  dispatch_kv_load(p, [&](auto load) {
    launch_t<HD, decltype(load)::value>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits,
                                        split_len, workspace, stream);
  });
}

template <int HD>
void launch_shared(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                   const int32_t* kv_index, const int32_t* block_tables, void* out, const AttentionParams& p,
                   int n_splits, int split_len, void* workspace, cudaStream_t stream) {
  dispatch_kv_load(p, [&](auto load) {
    launch_shared_t<HD, decltype(load)::value>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p,
                                               n_splits, split_len, workspace, stream);
  });
}

}  // namespace

namespace {
std::atomic<int> g_fp8_plain_loads{-1};  // -1: not read yet
}  // namespace

bool fp8_kv_plain_loads() {
  if (const int v = g_fp8_plain_loads.load(std::memory_order_relaxed); v >= 0) return v == 1;
  static const bool env_on = [] {
    const char* env = std::getenv("MXSERVE_FP8_KV_PLAIN_LOADS");
    const bool on = env != nullptr && std::strcmp(env, "1") == 0;
    if (on)
      MX_LOG(kWarn) << "MXSERVE_FP8_KV_PLAIN_LOADS=1: the FP8 KV cache attention kernels use the old plain-load "
                       "tile loader (slower; for before/after comparisons only): unset it for the cp.async pipeline";
    return on;
  }();
  int expected = -1;
  g_fp8_plain_loads.compare_exchange_strong(expected, env_on ? 1 : 0, std::memory_order_relaxed);
  return g_fp8_plain_loads.load(std::memory_order_relaxed) == 1;
}

void set_fp8_kv_plain_loads(bool on) { g_fp8_plain_loads.store(on ? 1 : 0, std::memory_order_relaxed); }

int paged_attention_shared_tokens_per_block() { return kSharedWarps; }

void paged_attention_mma_shared_bf16(const void* q, const void* k_cache, const void* v_cache,
                                     const int32_t* token_seq, const int32_t* kv_index, const int32_t* block_tables,
                                     void* out, const AttentionParams& p, int n_splits, int split_len,
                                     void* workspace, cudaStream_t stream) {
  MX_CHECK_MSG(p.tree_mask == nullptr, "paged_attention_mma_shared: tree masks are not supported by this kernel");
  switch (p.head_dim) {
    case 16: launch_shared<16>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits, split_len, workspace, stream); break;
    case 32: launch_shared<32>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits, split_len, workspace, stream); break;
    case 64: launch_shared<64>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits, split_len, workspace, stream); break;
    case 128: launch_shared<128>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, n_splits, split_len, workspace, stream); break;
    default: MX_CHECK_MSG(false, "paged_attention_mma_shared: head_dim " << p.head_dim << " is not built");
  }
}

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
