// Cascade (shared-prefix) decode attention (cascade_attention.h), tensor cores (mma.sync m16n8k16, the
// per-tile math of paged_attention_mma_tile.cuh):
//   prefix pass: one block of 4 warps per (work item, kv head, prefix split: the item's prefix in equal
//     64-key aligned parts, so a graph's fixed split count fits any prefix); a work item is 64 query rows of
//     one group (members x G heads, rows straddle members: row r = member r / G, head r % G), so every K/V
//     tile of 64 shared keys is read once per 64 rows of the group instead of once per member;
//   suffix pass: one warp per (row, kv head, split) over keys [prefix_keys, kv_index] (the suffix in equal
//     16-key aligned parts), the per-warp decode kernel's 16-key cp.async pipeline on the non-shared keys;
//   merge: one block per (row, head): every partial (o unnormalized, running max m, sum l) of both passes is
//     combined by the log-sum-exp rule (o = sum_i o_i e^(m_i - M) / sum_i l_i e^(m_i - M)).
// Invariants: both passes always write a partial for every (row, head, split) they own (an empty key range
// writes m = -inf, l = 0), so the merge needs no count; rows with prefix_keys 0 have no prefix partials and the
// merge never reads them. FP8 E4M3 caches: the per-sequence kernels' tile loader (kv_fp8_tile.cuh: cp.async of the
// raw codes, dequantized from shared memory into one bf16 tile; or the old plain loads, kv_fp8_load_mode.h).
// Graph replays read everything from device memory (the buffer of cascade_attention.h).
#include "kernels/cuda/attention/cascade_attention.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>

#include "core/check.h"
#include "kernels/cuda/attention/kv_fp8_load.cuh"
#include "kernels/cuda/attention/kv_fp8_tile.cuh"
#include "kernels/cuda/attention/paged_attention_mma.h"
#include "kernels/cuda/attention/paged_attention_mma_tile.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

using namespace mma_tile;

constexpr int kPrefixWarps = kCascadeRowsPerItem / 16;  // 4: 64 query rows per block
constexpr int kPrefixKeys = 64;
constexpr int kSuffixWarps = 4;
constexpr int kSuffixKeys = 16;
constexpr int kStages = 3;
static_assert(kPrefixWarps * 16 == kCascadeRowsPerItem);

template <int HD, KvLoad L>
constexpr size_t prefix_smem() {
  return kv_pipeline_bytes<HD, kPrefixKeys, L>(kStages);
}
template <int HD, KvLoad L>
constexpr size_t suffix_smem() {
  return static_cast<size_t>(kSuffixWarps) * kv_pipeline_bytes<HD, kSuffixKeys, L>(kStages);
}

// Q fragments of a warp whose two rows per lane (g, g + 8) come from arbitrary (token, head) rows: row_g /
// row_g8 point at the rows' head_dim values, null for padding (zero rows).
template <int HD>
__device__ __forceinline__ void load_q_rows(const bf16* row_g, const bf16* row_g8, int lane,
                                            uint32_t (&qa)[HD / 16][4]) {
  const int tq = lane % 4;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bf16* row = (i % 2) == 0 ? row_g : row_g8;
      const int col = ks * 16 + 8 * (i / 2) + 2 * tq;
      qa[ks][i] = row != nullptr ? *reinterpret_cast<const uint32_t*>(row + col) : 0u;
    }
}

// The warp's partials: head_row[hr] (t * n_heads + head, or -1 for padding) of rows g and g + 8 of this lane.
// Workspace section: o [n_parts][HD], m [n_parts], l [n_parts], part = head_row * n_splits + split.
template <int HD>
__device__ __forceinline__ void write_partial(WarpState<HD>& st, const int64_t (&head_row)[2], int split, int n_splits,
                                              int64_t n_parts, float* ws, int lane) {
  constexpr int NT = HD / 8;
  const int tq = lane % 4;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    st.l[hr] += __shfl_xor_sync(0xffffffffu, st.l[hr], 1);
    st.l[hr] += __shfl_xor_sync(0xffffffffu, st.l[hr], 2);
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    if (head_row[hr] < 0) continue;
    const int64_t part = head_row[hr] * n_splits + split;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      *reinterpret_cast<float2*>(ws + part * HD + n * 8 + 2 * tq) = make_float2(st.o[n][2 * hr], st.o[n][2 * hr + 1]);
    if (tq == 0) {
      ws[n_parts * HD + part] = st.m[hr];
      ws[n_parts * (HD + 1) + part] = st.l[hr];
    }
  }
}

// One 16-byte chunk (8 elements at `d`) of key `key` of a table into the K and V tiles (row j); keys outside
// [.., kv_end) are zero-filled (finite, then masked by process_tile).
template <int HD, KvLoad kLoad>
__device__ __forceinline__ void load_chunk(bf16* kd, bf16* vd, int j, int d, int key, int kv_end, const int32_t* table,
                                           const bf16* k_cache, const bf16* v_cache, int kvh, const AttentionParams& p) {
  constexpr int R = row_stride<HD>();
  const bool ok = key < kv_end;
  int64_t off = 0, slot = 0;
  if (ok) {
    slot = static_cast<int64_t>(table[key / p.block_size]) * p.block_size + key % p.block_size;
    off = slot * (static_cast<int64_t>(p.n_kv_heads) * HD) + kvh * HD + d;
  }
  if constexpr (kLoad == KvLoad::kFp8Plain) {
    uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;
    if (ok) load_fp8_kv_chunk(k_cache, v_cache, off, slot, kvh, p, kr, vr);
    *reinterpret_cast<uint4*>(kd + j * R + d) = kr;
    *reinterpret_cast<uint4*>(vd + j * R + d) = vr;
  } else {
    cp_async16(kd + j * R + d, k_cache + off, ok);
    cp_async16(vd + j * R + d, v_cache + off, ok);
  }
}

// Prefix pass: grid (cap_work, n_kv_heads, n_splits), kPrefixWarps warps; warp w serves rows
// [row_begin + 16 w, + 16) of the item's group; all warps load each 64-key tile of the shared blocks.
template <int HD, KvLoad kLoad>
__global__ void __launch_bounds__(kPrefixWarps * 32)
    cascade_prefix_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                          const int32_t* __restrict__ token_seq, const int32_t* __restrict__ block_tables,
                          const int32_t* __restrict__ cascade, float* __restrict__ ws, AttentionParams p, int cap_rows,
                          int n_splits) {
  constexpr int R = row_stride<HD>();
  constexpr int CH = HD / 8;
  const int32_t* item = cascade + 2 * cap_rows + 4 * static_cast<int64_t>(blockIdx.x);
  const int member_begin = item[0], n_members = item[1], row_begin = item[2], keys = item[3];
  if (n_members == 0) return;  // an unused work item (uniform over the block)
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* tiles = reinterpret_cast<bf16*>(smem);  // [kStages][K | V][kPrefixKeys][R]; kFp8Async: kv_fp8_tile.cuh
  const int32_t* members = cascade + cap_rows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int G = p.n_heads / p.n_kv_heads;
  const int rows_total = n_members * G;
  // The item's prefix in n_splits equal parts (64-key aligned): every split has keys whatever the prefix length.
  const int split_len = ((keys + n_splits - 1) / n_splits + kPrefixKeys - 1) / kPrefixKeys * kPrefixKeys;
  const int kv_begin = split * split_len;
  const int kv_end = min(keys, kv_begin + split_len);
  const int warp_row0 = row_begin + warp * 16;
  const bool active = warp_row0 < rows_total;

  int64_t head_row[2] = {-1, -1};
  const bf16* qrow[2] = {nullptr, nullptr};
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = warp_row0 + lane / 4 + 8 * hr;
    if (r < rows_total) {
      const int64_t t = members[member_begin + r / G];
      head_row[hr] = t * p.n_heads + static_cast<int64_t>(kvh) * G + r % G;
      qrow[hr] = q + head_row[hr] * HD;
    }
  }
  uint32_t qa[HD / 16][4];
  if (active) load_q_rows<HD>(qrow[0], qrow[1], lane, qa);
  WarpState<HD> st;
  init_state(st);

  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[members[member_begin]]) * p.max_blocks_per_seq;
  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kPrefixKeys - 1) / kPrefixKeys : 0;
  auto load_tile = [&](int stage, int tile) {
    bf16* kd = tiles + stage * 2 * kPrefixKeys * R;
    bf16* vd = kd + kPrefixKeys * R;
    const int k0 = kv_begin + tile * kPrefixKeys;
    if constexpr (kLoad == KvLoad::kFp8Async) {
      fp8_tile_issue<HD, kPrefixKeys, kPrefixWarps * 32>(
          smem + stage * Fp8Stage<HD, kPrefixKeys>::kBytes, threadIdx.x, k_cache, v_cache, kvh, p,
          [&](int j) { return table_slot_or_none(k0 + j < kv_end, k0 + j, table, p.block_size); });
    } else {
      for (int c = threadIdx.x; c < kPrefixKeys * CH; c += kPrefixWarps * 32) {
        const int j = c / CH, d = (c % CH) * 8;
        load_chunk<HD, kLoad>(kd, vd, j, d, k0 + j, kv_end, table, k_cache, v_cache, kvh, p);
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
    if constexpr (kLoad == KvLoad::kFp8Async) {  // every thread: the landed stage -> the bf16 tile
      bf16* dq = fp8_dequant_tile<HD, kPrefixKeys>(smem, kStages);
      fp8_tile_dequant<HD, kPrefixKeys, kPrefixWarps * 32>(smem + (it % kStages) * Fp8Stage<HD, kPrefixKeys>::kBytes,
                                                           dq, dq + kPrefixKeys * R, threadIdx.x);
      __syncthreads();
    }
    if (active) {
      const bf16* kd = kLoad == KvLoad::kFp8Async ? fp8_dequant_tile<HD, kPrefixKeys>(smem, kStages)
                                                  : tiles + (it % kStages) * 2 * kPrefixKeys * R;
      process_tile<HD, kPrefixKeys>(kd, kd + kPrefixKeys * R, kv_begin + it * kPrefixKeys, kv_end, p.scale, qa, st,
                                    lane);
    }
  }
  cp_async_wait<0>();
  if (active) {
    const int64_t n_parts = static_cast<int64_t>(p.n_tokens) * p.n_heads * n_splits;
    write_partial<HD>(st, head_row, split, n_splits, n_parts, ws, lane);
  }
}

// Suffix pass: one warp per (row t, kv head, split) over keys [prefix_keys[t] + split * split_len, ...) up to
// kv_index[t] (inclusive), a private 3-stage pipeline of 16-key tiles.
template <int HD, KvLoad kLoad>
__global__ void __launch_bounds__(kSuffixWarps * 32)
    cascade_suffix_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                          const int32_t* __restrict__ token_seq, const int32_t* __restrict__ kv_index,
                          const int32_t* __restrict__ block_tables, const int32_t* __restrict__ cascade,
                          float* __restrict__ ws, AttentionParams p, int n_splits, int split_len_plain, int64_t n_items) {
  constexpr int R = row_stride<HD>();
  constexpr int CH = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kSuffixWarps + warp;
  if (item >= n_items) return;  // warps are independent: no block-wide barrier below
  bf16* wsm = reinterpret_cast<bf16*>(smem) + static_cast<size_t>(warp) * kStages * 2 * kSuffixKeys * R;
  unsigned char* fp8_region = smem + static_cast<size_t>(warp) * kv_pipeline_bytes<HD, kSuffixKeys, kLoad>(kStages);
  const int split = static_cast<int>(item % n_splits);
  const int64_t tk = item / n_splits;
  const int kvh = static_cast<int>(tk % p.n_kv_heads);
  const int64_t t = tk / p.n_kv_heads;
  const int G = p.n_heads / p.n_kv_heads;
  const int n_ctx = kv_index[t] + 1;
  // A row in a group: its suffix [prefix keys (cascade[t]), n_ctx) in n_splits equal parts (16-key aligned). A row
  // in none: the per-warp decode kernel's splits (split_len_plain), so a graph replayed without groups computes
  // bit for bit what the per-sequence kernel would (graphs == eager).
  const int suffix = max(0, n_ctx - cascade[t]);
  const int split_len = cascade[t] == 0
                            ? split_len_plain
                            : ((suffix + n_splits - 1) / n_splits + kSuffixKeys - 1) / kSuffixKeys * kSuffixKeys;
  const int kv_begin = cascade[t] + split * split_len;
  const int kv_end = min(n_ctx, kv_begin + split_len);
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * p.max_blocks_per_seq;

  int64_t head_row[2] = {-1, -1};
  const bf16* qrow[2] = {nullptr, nullptr};
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int h = lane / 4 + 8 * hr;
    if (h < G) {
      head_row[hr] = t * p.n_heads + static_cast<int64_t>(kvh) * G + h;
      qrow[hr] = q + head_row[hr] * HD;
    }
  }
  uint32_t qa[HD / 16][4];
  load_q_rows<HD>(qrow[0], qrow[1], lane, qa);
  WarpState<HD> st;
  init_state(st);
  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kSuffixKeys - 1) / kSuffixKeys : 0;
  auto load_tile = [&](int stage, int tile) {
    bf16* kd = wsm + stage * 2 * kSuffixKeys * R;
    bf16* vd = kd + kSuffixKeys * R;
    const int k0 = kv_begin + tile * kSuffixKeys;
    if constexpr (kLoad == KvLoad::kFp8Async) {
      fp8_tile_issue<HD, kSuffixKeys, 32>(
          fp8_region + stage * Fp8Stage<HD, kSuffixKeys>::kBytes, lane, k_cache, v_cache, kvh, p,
          [&](int j) { return table_slot_or_none(k0 + j < kv_end, k0 + j, table, p.block_size); });
    } else {
#pragma unroll
      for (int c = lane; c < kSuffixKeys * CH; c += 32) {
        const int j = c / CH, d = (c % CH) * 8;
        load_chunk<HD, kLoad>(kd, vd, j, d, k0 + j, kv_end, table, k_cache, v_cache, kvh, p);
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
    __syncwarp();
    if (it + kStages - 1 < n_tiles) load_tile((it + kStages - 1) % kStages, it + kStages - 1);
    cp_async_commit();
    const bf16* kd = wsm + (it % kStages) * 2 * kSuffixKeys * R;
    if constexpr (kLoad == KvLoad::kFp8Async) {  // the landed stage -> the bf16 tile (free: the wait above)
      bf16* dq = fp8_dequant_tile<HD, kSuffixKeys>(fp8_region, kStages);
      fp8_tile_dequant<HD, kSuffixKeys, 32>(fp8_region + (it % kStages) * Fp8Stage<HD, kSuffixKeys>::kBytes, dq,
                                            dq + kSuffixKeys * R, lane);
      __syncwarp();
      kd = dq;
    }
    process_tile<HD, kSuffixKeys>(kd, kd + kSuffixKeys * R, kv_begin + it * kSuffixKeys, kv_end, p.scale, qa, st, lane);
  }
  cp_async_wait<0>();
  const int64_t n_parts = static_cast<int64_t>(p.n_tokens) * p.n_heads * n_splits;
  write_partial<HD>(st, head_row, split, n_splits, n_parts, ws, lane);
}

// Merge: one block per (row, head), thread d: the suffix partials, then (prefix_keys > 0) the prefix ones.
template <int HD>
__global__ void cascade_merge_kernel(const float* __restrict__ ws_suffix, const float* __restrict__ ws_prefix,
                                     const int32_t* __restrict__ cascade, bf16* __restrict__ out, int64_t n_rows,
                                     int n_heads, int n_suffix, int n_prefix) {
  const int64_t row = blockIdx.x;
  const int d = threadIdx.x;
  const bool has_prefix = cascade[row / n_heads] > 0;
  float mx = -INFINITY;
  const int64_t ns = n_rows * n_suffix, np = n_rows * n_prefix;
  for (int s = 0; s < n_suffix; ++s) mx = fmaxf(mx, ws_suffix[ns * HD + row * n_suffix + s]);
  if (has_prefix)
    for (int s = 0; s < n_prefix; ++s) mx = fmaxf(mx, ws_prefix[np * HD + row * n_prefix + s]);
  float denom = 0.f, acc = 0.f;
  for (int s = 0; s < n_suffix; ++s) {
    const float m = ws_suffix[ns * HD + row * n_suffix + s];
    if (m == -INFINITY) continue;  // an empty split
    const float w = expf(m - mx);
    denom += ws_suffix[ns * (HD + 1) + row * n_suffix + s] * w;
    acc += ws_suffix[(row * n_suffix + s) * HD + d] * w;
  }
  if (has_prefix)
    for (int s = 0; s < n_prefix; ++s) {
      const float m = ws_prefix[np * HD + row * n_prefix + s];
      if (m == -INFINITY) continue;
      const float w = expf(m - mx);
      denom += ws_prefix[np * (HD + 1) + row * n_prefix + s] * w;
      acc += ws_prefix[(row * n_prefix + s) * HD + d] * w;
    }
  // One partial (one suffix split, no prefix): o * (1 / l), as the per-warp kernel's unsplit epilogue; else
  // acc / denom, as attention_combine_kernel (the same loop order: bit-identical results without groups).
  if (n_suffix == 1 && !has_prefix)
    out[row * HD + d] = to_bf16(acc * (denom > 0.f ? 1.f / denom : 0.f));
  else
    out[row * HD + d] = to_bf16(denom > 0.f ? acc / denom : 0.f);
}

std::atomic<int64_t> g_launches{0};

size_t section_bytes(const AttentionParams& p, int splits) {
  return static_cast<size_t>(p.n_tokens) * p.n_heads * splits * (p.head_dim + 2) * sizeof(float);
}

template <int HD, KvLoad kLoad>
void launch_t(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
              const int32_t* kv_index, const int32_t* block_tables, const int32_t* cascade, void* out,
              const AttentionParams& p, const CascadeShape& shape, const CascadeLaunch& plan, void* workspace,
              cudaStream_t stream) {
  static bool configured = false;  // NOTE: > 48 KB of dynamic shared memory needs an opt-in, once
  if (!configured) {
    MX_CUDA_CHECK(cudaFuncSetAttribute(cascade_prefix_kernel<HD, kLoad>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(prefix_smem<HD, kLoad>())));
    MX_CUDA_CHECK(cudaFuncSetAttribute(cascade_suffix_kernel<HD, kLoad>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(suffix_smem<HD, kLoad>())));
    configured = true;
  }
  const auto* qb = static_cast<const bf16*>(q);
  const auto* kb = static_cast<const bf16*>(k_cache);
  const auto* vb = static_cast<const bf16*>(v_cache);
  float* ws_suffix = static_cast<float*>(workspace);
  float* ws_prefix = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + section_bytes(p, plan.suffix_splits));
  if (shape.cap_work > 0) {
    const dim3 grid(static_cast<unsigned>(shape.cap_work), p.n_kv_heads, plan.prefix_splits);
    cascade_prefix_kernel<HD, kLoad><<<grid, kPrefixWarps * 32, prefix_smem<HD, kLoad>(), stream>>>(
        qb, kb, vb, token_seq, block_tables, cascade, ws_prefix, p, shape.cap_rows, plan.prefix_splits);
    MX_CUDA_CHECK_LAUNCH();
  }
  const int64_t items = static_cast<int64_t>(p.n_tokens) * p.n_kv_heads * plan.suffix_splits;
  const int64_t blocks = (items + kSuffixWarps - 1) / kSuffixWarps;
  MX_CHECK_LT(blocks, int64_t{1} << 31);
  cascade_suffix_kernel<HD, kLoad><<<static_cast<unsigned>(blocks), kSuffixWarps * 32, suffix_smem<HD, kLoad>(), stream>>>(
      qb, kb, vb, token_seq, kv_index, block_tables, cascade, ws_suffix, p, plan.suffix_splits,
      plan.suffix_split_len, items);
  MX_CUDA_CHECK_LAUNCH();
  const int64_t rows = static_cast<int64_t>(p.n_tokens) * p.n_heads;
  cascade_merge_kernel<HD><<<static_cast<unsigned>(rows), HD, 0, stream>>>(
      ws_suffix, ws_prefix, cascade, static_cast<bf16*>(out), rows, p.n_heads, plan.suffix_splits,
      shape.cap_work > 0 ? plan.prefix_splits : 0);
  MX_CUDA_CHECK_LAUNCH();
}

template <int HD>
void launch(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq, const int32_t* kv_index,
            const int32_t* block_tables, const int32_t* cascade, void* out, const AttentionParams& p,
            const CascadeShape& shape, const CascadeLaunch& plan, void* workspace, cudaStream_t stream) {
  dispatch_kv_load(p, [&](auto load) {
    launch_t<HD, decltype(load)::value>(q, k_cache, v_cache, token_seq, kv_index, block_tables, cascade, out, p, shape,
                                        plan, workspace, stream);
  });
}

}  // namespace

int64_t cascade_attention_launches() { return g_launches.load(std::memory_order_relaxed); }

bool cascade_attention_supports(const AttentionParams& p, const char** why) {
  const char* reason = nullptr;
  if (!paged_attention_mma_supports(p)) reason = "head_dim not in {16, 32, 64, 128} or more than 16 q heads per kv head";
  else if (p.tree_mask != nullptr) reason = "tree-masked rows";
  if (why != nullptr) *why = reason;
  return reason == nullptr;
}

CascadeLaunch plan_cascade_attention(const AttentionParams& p, const CascadeShape& shape, int n_sms,
                                     const AttentionPlanOptions& options) {
  CascadeLaunch plan;
  // Suffix: the per-warp decode kernel's split rule for the suffix contexts.
  AttentionParams sp = p;
  if (shape.max_suffix_keys > 0) sp.max_kv_len = std::min(p.max_kv_len > 0 ? p.max_kv_len : INT_MAX, shape.max_suffix_keys);
  sp.n_leading_decode_rows = p.n_tokens;
  AttentionPlanOptions so = options;
  so.force = AttentionPlanOptions::Force::kWarp;
  const AttentionLaunch sl = plan_paged_attention(sp, n_sms, so);
  plan.suffix_splits = std::max(1, sl.n_splits);
  plan.suffix_split_len = sl.n_splits > 1 ? sl.split_len : (1 << 30);
  plan.suffix_split_source = sl.split_source;
  // Prefix: ~2 blocks per SM over the expected work items x kv heads, >= 256 keys per split, 64-key aligned.
  const int64_t max_prefix = std::max(1, shape.max_prefix_keys);
  const int64_t work = std::max(1, shape.n_work_hint > 0 ? shape.n_work_hint : shape.cap_work);
  const int64_t base = work * p.n_kv_heads;
  int64_t splits = std::max<int64_t>(1, (2ll * n_sms + base - 1) / base);
  splits = std::min(splits, std::max<int64_t>(1, (max_prefix + 255) / 256));
  int64_t len = (max_prefix + splits - 1) / splits;
  len = (len + kPrefixKeys - 1) / kPrefixKeys * kPrefixKeys;
  splits = (max_prefix + len - 1) / len;
  plan.prefix_splits = static_cast<int>(splits);
  plan.workspace_bytes = section_bytes(p, plan.suffix_splits) + section_bytes(p, plan.prefix_splits);
  return plan;
}

void cascade_attention_bf16(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                            const int32_t* kv_index, const int32_t* block_tables, const int32_t* cascade, void* out,
                            const AttentionParams& p, const CascadeShape& shape, const CascadeLaunch& plan,
                            void* workspace, cudaStream_t stream) {
  if (p.n_tokens == 0) return;
  const char* why = nullptr;
  MX_CHECK_MSG(cascade_attention_supports(p, &why), "cascade attention: " << why);
  MX_CHECK_MSG(p.n_tokens <= shape.cap_rows, "cascade attention: " << p.n_tokens << " rows > capacity " << shape.cap_rows);
  MX_CHECK_MSG(workspace != nullptr, "cascade attention: no workspace");
  g_launches.fetch_add(1, std::memory_order_relaxed);
  switch (p.head_dim) {
    case 16: launch<16>(q, k_cache, v_cache, token_seq, kv_index, block_tables, cascade, out, p, shape, plan, workspace, stream); break;
    case 32: launch<32>(q, k_cache, v_cache, token_seq, kv_index, block_tables, cascade, out, p, shape, plan, workspace, stream); break;
    case 64: launch<64>(q, k_cache, v_cache, token_seq, kv_index, block_tables, cascade, out, p, shape, plan, workspace, stream); break;
    case 128: launch<128>(q, k_cache, v_cache, token_seq, kv_index, block_tables, cascade, out, p, shape, plan, workspace, stream); break;
    default: MX_CHECK_MSG(false, "cascade attention: head_dim " << p.head_dim << " is not built");
  }
}

CascadeBatchPlan plan_cascade_batch(const AttentionParams& p, const CascadeShape& shape, int n_sms,
                                    const AttentionPlanOptions& options) {
  CascadeBatchPlan plan;
  plan.n_cascade = std::clamp(p.n_leading_decode_rows, 0, std::min(p.n_tokens, shape.cap_rows));
  plan.cascade_params = p;
  plan.cascade_params.n_tokens = plan.n_cascade;
  plan.cascade_params.n_seqs = plan.n_cascade;
  plan.cascade_params.n_leading_decode_rows = plan.n_cascade;
  if (plan.n_cascade > 0) plan.cascade = plan_cascade_attention(plan.cascade_params, shape, n_sms, options);
  plan.workspace_bytes = plan.cascade.workspace_bytes;
  if (plan.n_cascade < p.n_tokens) {
    AttentionParams rest = p;
    rest.n_tokens = p.n_tokens - plan.n_cascade;
    rest.n_seqs = std::max(1, p.n_seqs - plan.n_cascade);
    rest.n_leading_decode_rows = 0;
    if (rest.tree_mask != nullptr) {  // per-row pointers start at the rest's first row
      rest.tree_mask += plan.n_cascade;
      rest.tree_base += plan.n_cascade;
    }
    plan.rest = plan_paged_attention_batch(rest, n_sms, options);
    plan.workspace_bytes = std::max(plan.workspace_bytes, plan.rest.workspace_bytes);
  }
  return plan;
}

void cascade_attention_batch(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                             const int32_t* kv_index, const int32_t* block_tables, const int32_t* cascade, void* out,
                             const CascadeShape& shape, const CascadeBatchPlan& plan, void* workspace,
                             cudaStream_t stream) {
  if (plan.n_cascade > 0)
    cascade_attention_bf16(q, k_cache, v_cache, token_seq, kv_index, block_tables, cascade, out, plan.cascade_params,
                           shape, plan.cascade, workspace, stream);
  if (plan.rest.n_parts == 0) return;
  const AttentionParams& p = plan.cascade_params;
  const int64_t r = plan.n_cascade, row_elems = static_cast<int64_t>(p.n_heads) * p.head_dim;
  paged_attention_batch(static_cast<const uint16_t*>(q) + r * row_elems, k_cache, v_cache, token_seq + r, kv_index + r,
                        block_tables, static_cast<uint16_t*>(out) + r * row_elems, plan.rest, workspace, stream);
}

}  // namespace mxserve::kernels::cuda
