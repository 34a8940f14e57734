// Paged causal GQA attention (prefill and decode are the same kernel): one block per (token, kv head,
// context split) serves the kv head's whole query-head group, so each K/V tile is read once per group.
// Key tiles of 64 go through shared memory; softmax is online (flash-style) in fp32 with expf, the
// scores are dot * scale exactly as the CPU reference. With n_splits > 1 each split writes its partial
// (max, sum, unnormalized acc) to workspace and attention_combine_kernel merges them.
// Invariant: token t attends to KV indices [0, kv_index[t]] of its sequence; slots come from the
// block table row token_seq[t] (block_tables [rows, max_blocks_per_seq]).
// FP8 E4M3 caches (p.k_scales set) are read by every kernel here: the K/V load dequantizes the codes in
// registers with the (slot, kv head) scale (kv_fp8_load.cuh) and the tiles in shared memory are bf16 as
// for a bf16 cache. NOTE: this CUDA-core kernel's FP8 load is a plain load; the tensor-core kernels
// (paged_attention_mma.cu) stream the raw codes through their cp.async pipeline (kv_fp8_tile.cuh).
// This file also owns the planner: the tensor-core kernels (paged_attention_mma.cu: per-warp for
// decode-like batches, block-shared for prefill-like ones) serve head_dim 16..128 with groups <= 16;
// this CUDA-core kernel serves the rest (head_dim 256, groups up to 32). AttentionPlanOptions (the
// backend's typed kernel options) force one (tests and benchmarks compare the designs).
// NOTE: CUDA-core FMAs and plain 16-byte loads, split along the context for decode parallelism.
#include <algorithm>
#include <climits>
#include <cmath>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/attention_split_table.h"
#include "kernels/cuda/attention/kv_fp8_load.cuh"
#include "core/logging.h"
#include "kernels/cuda/attention/paged_attention_mma.h"
#include "kernels/cuda/attention/paged_attention_wgmma.h"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kKeyTile = 64;
constexpr int kThreads = 128;
constexpr int kMinSplitKeys = 256;
constexpr int64_t kDefaultWarpSplitTarget = 8;  // warps per SM, decode kernel (plan_warp)

template <int HD>
constexpr int padded_row() {
  return HD + 8;  // keeps rows 16-byte aligned and makes 16-byte row reads bank-conflict free
}

template <int HD>
size_t smem_bytes(int group) {
  return 2ull * kKeyTile * padded_row<HD>() * sizeof(bf16) +
         (2ull * group * HD + static_cast<size_t>(group) * kKeyTile + 3ull * group) * sizeof(float) +
         kKeyTile * sizeof(int);
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                           const bf16* __restrict__ v_cache, const int32_t* __restrict__ token_seq,
                           const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                           bf16* __restrict__ out, float* __restrict__ ws, AttentionParams p, int n_splits,
                           int split_len) {
  constexpr int KS = padded_row<HD>();
  extern __shared__ __align__(16) unsigned char smem[];
  const int G = p.n_heads / p.n_kv_heads;
  bf16* k_s = reinterpret_cast<bf16*>(smem);            // [kKeyTile][KS]
  bf16* v_s = k_s + kKeyTile * KS;                       // [kKeyTile][KS]
  float* q_s = reinterpret_cast<float*>(v_s + kKeyTile * KS);  // [G][HD]
  float* acc_s = q_s + G * HD;                           // [G][HD]
  float* p_s = acc_s + G * HD;                           // [G][kKeyTile] scores, then probabilities
  float* m_s = p_s + G * kKeyTile;                       // [G] running max
  float* l_s = m_s + G;                                  // [G] running sum
  float* alpha_s = l_s + G;                              // [G] rescale of this tile
  int* slot_s = reinterpret_cast<int*>(alpha_s + G);     // [kKeyTile]

  const int64_t t = blockIdx.x;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int n_ctx = kv_index[t] + 1;
  const int kv_begin = split * split_len;
  const int kv_end = min(n_ctx, kv_begin + split_len);
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * p.max_blocks_per_seq;
  const int64_t kv_width = static_cast<int64_t>(p.n_kv_heads) * HD;
  // Tree rows: keys >= tbase only where the ancestor mask has their bit (AttentionParams).
  const int tbase = p.tree_mask != nullptr ? p.tree_base[t] : INT_MAX;
  const uint64_t tmask = p.tree_mask != nullptr ? p.tree_mask[t] : 0ull;

  for (int i = threadIdx.x; i < G * HD; i += kThreads) {
    const int h = i / HD, d = i % HD;
    q_s[i] = to_f32(q[(t * p.n_heads + kvh * G + h) * HD + d]);
    acc_s[i] = 0.f;
  }
  for (int h = threadIdx.x; h < G; h += kThreads) {
    m_s[h] = -INFINITY;
    l_s[h] = 0.f;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int k0 = kv_begin; k0 < kv_end; k0 += kKeyTile) {
    const int n_keys = min(kKeyTile, kv_end - k0);
    for (int j = threadIdx.x; j < kKeyTile; j += kThreads) {
      const int idx = k0 + j;
      // Tree-masked keys are not loaded (zero-filled): less traffic, and never 0 * NaN from a stale slot.
      const bool visible = j < n_keys && (idx < tbase || ((tmask >> (idx - tbase)) & 1ull) != 0);
      slot_s[j] = visible ? table[idx / p.block_size] * p.block_size + idx % p.block_size : -1;
    }
    __syncthreads();
    constexpr int kChunks = HD / 8;
    for (int i = threadIdx.x; i < kKeyTile * kChunks; i += kThreads) {
      const int j = i / kChunks, c = i % kChunks;
      uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;
      if (slot_s[j] >= 0) {
        const int64_t off = static_cast<int64_t>(slot_s[j]) * kv_width + kvh * HD + c * 8;
        if (p.k_scales != nullptr) {  // FP8 cache: e4m3 codes (k_cache / v_cache point at bytes), in registers
          load_fp8_kv_chunk(k_cache, v_cache, off, slot_s[j], kvh, p, kr, vr);
        } else {
          kr = *reinterpret_cast<const uint4*>(k_cache + off);
          vr = *reinterpret_cast<const uint4*>(v_cache + off);
        }
      }
      *reinterpret_cast<uint4*>(k_s + j * KS + c * 8) = kr;
      *reinterpret_cast<uint4*>(v_s + j * KS + c * 8) = vr;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * kKeyTile; i += kThreads) {
      const int h = i / kKeyTile, j = i % kKeyTile;
      float s = -INFINITY;
      const int key = k0 + j;
      if (j < n_keys && (key < tbase || ((tmask >> (key - tbase)) & 1ull) != 0)) {
        const float* qh = q_s + h * HD;
        const bf16* kj = k_s + j * KS;
        float dot = 0.f;
#pragma unroll
        for (int c = 0; c < HD; c += 8) {
          float kf[8];
          load8(kj + c, kf);
#pragma unroll
          for (int e = 0; e < 8; ++e) dot += qh[c + e] * kf[e];
        }
        s = dot * p.scale;
      }
      p_s[i] = s;
    }
    __syncthreads();
    for (int h = warp; h < G; h += kThreads / 32) {
      float* ph = p_s + h * kKeyTile;
      const float m_old = m_s[h];
      float mx = -INFINITY;
      for (int j = lane; j < kKeyTile; j += 32) mx = fmaxf(mx, ph[j]);
      mx = warp_max(mx);
      const float m_new = fmaxf(m_old, mx);  // -inf only while every key so far was tree-masked
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      float sum = 0.f;
      for (int j = lane; j < kKeyTile; j += 32) {
        const float e = j < n_keys ? expf(ph[j] - m_use) : 0.f;  // masked: exp(-inf) = 0
        ph[j] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
        alpha_s[h] = alpha;
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += kThreads) {
      const int h = i / HD, d = i % HD;
      const float* ph = p_s + h * kKeyTile;
      float a = acc_s[i] * alpha_s[h];
      for (int j = 0; j < n_keys; ++j) a += ph[j] * to_f32(v_s[j * KS + d]);
      acc_s[i] = a;
    }
    __syncthreads();
  }

  for (int i = threadIdx.x; i < G * HD; i += kThreads) {
    const int h = i / HD, d = i % HD;
    const int64_t head_row = t * p.n_heads + kvh * G + h;
    if (n_splits == 1) {
      const float l = l_s[h];
      out[head_row * HD + d] = to_bf16(l > 0.f ? acc_s[i] / l : 0.f);
    } else {
      const int64_t part = head_row * n_splits + split;
      const int64_t n_parts = static_cast<int64_t>(p.n_tokens) * p.n_heads * n_splits;
      ws[part * HD + d] = acc_s[i];
      if (d == 0) {
        ws[n_parts * HD + part] = m_s[h];
        ws[n_parts * (HD + 1) + part] = l_s[h];
      }
    }
  }
}

// One block per (token, head); thread d merges the splits' partial results for output dim d.
template <int HD>
__global__ void attention_combine_kernel(const float* __restrict__ ws, bf16* __restrict__ out, int64_t n_rows,
                                         int n_splits) {
  const int64_t row = blockIdx.x;
  const int d = threadIdx.x;
  const int64_t n_parts = n_rows * n_splits;
  const float* m = ws + n_parts * HD + row * n_splits;
  const float* l = ws + n_parts * (HD + 1) + row * n_splits;
  float mx = -INFINITY;
  for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, m[s]);
  float denom = 0.f, acc = 0.f;
  for (int s = 0; s < n_splits; ++s) {
    if (m[s] == -INFINITY) continue;  // a split past this token's context
    const float w = expf(m[s] - mx);
    denom += l[s] * w;
    acc += ws[(row * n_splits + s) * HD + d] * w;
  }
  out[row * HD + d] = to_bf16(denom > 0.f ? acc / denom : 0.f);
}

template <int HD>
void launch(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
            const int32_t* kv_index, const int32_t* block_tables, void* out, const AttentionParams& p,
            const AttentionLaunch& plan, void* workspace, cudaStream_t stream) {
  const int group = p.n_heads / p.n_kv_heads;
  const size_t smem = smem_bytes<HD>(group);
  static size_t configured = 0;  // NOTE: opt-in above 48 KB of dynamic shared memory, once per size
  if (smem > 48 * 1024 && smem > configured) {
    MX_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    configured = smem;
  }
  const dim3 grid(p.n_tokens, p.n_kv_heads, plan.n_splits);
  paged_attention_kernel<HD><<<grid, kThreads, smem, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k_cache), static_cast<const bf16*>(v_cache), token_seq,
      kv_index, block_tables, static_cast<bf16*>(out), static_cast<float*>(workspace), p, plan.n_splits,
      plan.split_len);
  MX_CUDA_CHECK_LAUNCH();
  if (plan.n_splits > 1) {
    const int64_t rows = static_cast<int64_t>(p.n_tokens) * p.n_heads;
    attention_combine_kernel<HD><<<static_cast<unsigned>(rows), HD, 0, stream>>>(
        static_cast<const float*>(workspace), static_cast<bf16*>(out), rows, plan.n_splits);
    MX_CUDA_CHECK_LAUNCH();
  }
}

void combine(const void* workspace, void* out, const AttentionParams& p, const AttentionLaunch& plan,
             cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.n_tokens) * p.n_heads;
  const auto* ws = static_cast<const float*>(workspace);
  auto* o = static_cast<bf16*>(out);
  const unsigned grid = static_cast<unsigned>(rows);
  switch (p.head_dim) {
    case 16: attention_combine_kernel<16><<<grid, 16, 0, stream>>>(ws, o, rows, plan.n_splits); break;
    case 32: attention_combine_kernel<32><<<grid, 32, 0, stream>>>(ws, o, rows, plan.n_splits); break;
    case 64: attention_combine_kernel<64><<<grid, 64, 0, stream>>>(ws, o, rows, plan.n_splits); break;
    case 128: attention_combine_kernel<128><<<grid, 128, 0, stream>>>(ws, o, rows, plan.n_splits); break;
    default: MX_CHECK_MSG(false, "attention combine: head_dim " << p.head_dim);
  }
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace {

// Tensor-core kernel: one warp per (token, kv head, split); aim at ~8 resident warps per SM.
// Warps (token, kv head, split) the decode kernel aims for per SM: more splits put more K/V bytes in
// flight per SM (HBM latency) at the cost of a larger combine. AttentionPlanOptions::warp_split_target_per_sm
// overrides the default (benchmarks sweep it; see docs/perf/cuda-baseline.md).
// Default by the number of (token, kv head) items, from the H200 sweep in docs/perf/cuda-baseline.md
// (GLM-4.5-Air, 8 kv heads, 8k context; % of copy bandwidth at 4 / 8 / 16 / 32 warps per SM):
//   batch 8  (64 items):  35.9 / 61.0 / 56.6 / 49.2  -> 8
//   batch 32 (256 items): 52.8 / 46.0 / 51.5 / 66.5  -> 32
//   batch 64 (512 items): 71.2 / 55.9 / 61.2 / 61.4  -> 4
// NOTE: three measured points; the tuned per-(rows, context) table (AttentionPlanOptions::split_table,
// `mxserve tune-attention`) replaces this rule where one exists for the device and shape.
int64_t warp_split_target_per_sm(int64_t items, int64_t forced) {
  if (forced > 0) return forced;
  if (items <= 128) return kDefaultWarpSplitTarget;
  if (items <= 384) return 32;
  return 4;
}

// Splits every context so that `base` work items become about `target` (keys per split a multiple of
// `align`, at least `min_split`); plan keeps one unbounded split when that is already enough.
// Bound on any kv_index + 1: the batch's longest context when given (block-table rows may be wider).
int64_t context_bound(const AttentionParams& p) {
  return p.max_kv_len > 0 ? p.max_kv_len : static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
}

void split_context(const AttentionParams& p, int64_t base, int64_t target, int64_t min_split, int64_t align,
                   AttentionLaunch& plan) {
  const int64_t max_ctx = context_bound(p);
  plan.n_splits = 1;
  plan.split_len = 1 << 30;
  if (base >= target || max_ctx <= min_split) return;
  int64_t splits = std::min((target + base - 1) / base, (max_ctx + min_split - 1) / min_split);
  int64_t len = (max_ctx + splits - 1) / splits;
  len = (len + align - 1) / align * align;
  splits = (max_ctx + len - 1) / len;
  if (splits <= 1) return;
  plan.n_splits = static_cast<int>(splits);
  plan.split_len = static_cast<int>(len);
  plan.workspace_bytes = static_cast<size_t>(p.n_tokens) * p.n_heads * splits * (p.head_dim + 2) * sizeof(float);
}

// Exactly `splits` context splits (fewer when the context is short: keys per split a multiple of `align`,
// at least `min_split`).
void fixed_splits(const AttentionParams& p, int64_t splits, int64_t min_split, int64_t align, AttentionLaunch& plan) {
  const int64_t max_ctx = context_bound(p);
  plan.n_splits = 1;
  plan.split_len = 1 << 30;
  if (splits <= 1 || max_ctx <= min_split) return;
  int64_t len = std::max(min_split, (max_ctx + splits - 1) / splits);
  len = (len + align - 1) / align * align;
  splits = (max_ctx + len - 1) / len;
  if (splits <= 1) return;
  plan.n_splits = static_cast<int>(splits);
  plan.split_len = static_cast<int>(len);
  plan.workspace_bytes = static_cast<size_t>(p.n_tokens) * p.n_heads * splits * (p.head_dim + 2) * sizeof(float);
}

// Split count: forced (options), else the tuned table's bucket (kernels/attention_split_table.h), else the
// heuristic (warp_split_target_per_sm). The backend says once when a table exists but misses the shape.
AttentionLaunch plan_warp(const AttentionParams& p, int n_sms, const AttentionPlanOptions& o) {
  constexpr int64_t kMinSplit = 128, kAlign = 64;
  AttentionLaunch plan;
  plan.kernel = AttentionKernel::kWarp;
  if (o.warp_splits > 0) {
    fixed_splits(p, o.warp_splits, kMinSplit, kAlign, plan);
    plan.split_source = AttentionSplitSource::kForced;
    return plan;
  }
  if (o.warp_split_target_per_sm <= 0 && o.split_table != nullptr && o.split_table->tuned) {
    const int32_t tuned = lookup_attention_splits(*o.split_table, p.n_tokens, context_bound(p));
    if (tuned > 0) {
      fixed_splits(p, tuned, kMinSplit, kAlign, plan);
      plan.split_source = AttentionSplitSource::kTable;
      return plan;
    }
    plan.split_source = AttentionSplitSource::kOutsideTable;
  }
  if (o.warp_split_target_per_sm > 0) plan.split_source = AttentionSplitSource::kForced;
  const int64_t base = static_cast<int64_t>(p.n_tokens) * p.n_kv_heads;
  const int64_t target = warp_split_target_per_sm(base, o.warp_split_target_per_sm) * n_sms;
  split_context(p, base, target, kMinSplit, kAlign, plan);
  return plan;
}

// Block-shared tensor-core kernel: blocks of 8 tokens x one kv head; ~2 blocks per SM before splitting.
AttentionLaunch plan_shared(const AttentionParams& p, int n_sms) {
  constexpr int64_t kMinSplit = 256, kAlign = 64;
  AttentionLaunch plan;
  plan.kernel = AttentionKernel::kShared;
  const int64_t tpb = paged_attention_shared_tokens_per_block();
  const int64_t base = (p.n_tokens + tpb - 1) / tpb * p.n_kv_heads;
  const int64_t target = 2ll * n_sms;
  split_context(p, base, target, kMinSplit, kAlign, plan);
  return plan;
}

// The wgmma_ws plan for p (no context split). An FP8 cache is dequantized once into the workspace's bf16 scratch
// where it holds the step (every sequence sized as the longest context); beyond it, said once, the kernel's
// producer dequantizes per q-head block (~0.7x, docs/perf/seed-workload.md).
AttentionLaunch plan_wgmma(const AttentionParams& p, const AttentionPlanOptions& o) {
  AttentionLaunch plan;
  plan.kernel = AttentionKernel::kWgmmaWs;
  plan.split_len = 1 << 30;
  if (p.fp8_kv() && o.fp8_prefill == AttentionPlanOptions::Fp8Prefill::kAuto) {
    const int64_t slots = fp8_dequant_once_slots(p);
    if (slots <= kFp8DequantOnceSlots) {
      plan.fp8_dequant_once = true;
      plan.workspace_bytes = fp8_dequant_once_workspace_bytes(p);
    } else {
      MX_WARN_ONCE << "FP8 prefill attention: a step of " << p.n_seqs << " prefill sequence(s) with contexts up to "
                   << context_bound(p) << " keys needs " << slots << " bf16 context slots, over the dequantize-once "
                   << "scratch's " << kFp8DequantOnceSlots << "; the wgmma kernel dequantizes each K/V tile per "
                   << "q-head block instead (~0.7x its bf16 speed). Fewer sequences per prefill step (a lower "
                   << "--max-num-batched-tokens) keep the fast path";
    }
  }
  return plan;
}

}  // namespace

const char* attention_split_source_name(AttentionSplitSource s) {
  switch (s) {
    case AttentionSplitSource::kHeuristic: return "heuristic";
    case AttentionSplitSource::kTable: return "table";
    case AttentionSplitSource::kOutsideTable: return "outside-table";
    case AttentionSplitSource::kForced: return "forced";
  }
  return "?";
}

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kSimt: return "simt";
    case AttentionKernel::kWarp: return "warp";
    case AttentionKernel::kShared: return "shared";
    case AttentionKernel::kWgmmaWs: return "wgmma_ws";
  }
  return "?";
}

AttentionLaunch plan_paged_attention(const AttentionParams& p, int n_sms, const AttentionPlanOptions& options) {
  using Force = AttentionPlanOptions::Force;
  const Force force = options.force;
  if (paged_attention_mma_supports(p) && force != Force::kSimt) {
    // Prefill-like batches (>= 8 tokens per sequence on average) share K/V tiles across tokens. A tree
    // batch (speculative verification: up to 65 rows per sequence) always takes the per-warp kernel,
    // the tensor-core one that applies tree masks.
    bool shared = p.n_tokens >= 8ll * std::max(p.n_seqs, 1);
    if (force == Force::kWarp) shared = false;
    if (force == Force::kShared || force == Force::kWgmmaWs) shared = true;
    if (p.tree_mask != nullptr) shared = false;
    // Long prefill chunks (>= 64 rows per sequence on average, at least one wave of 128-row blocks) take the
    // wgmma kernel where it serves the batch (bf16 or FP8 cache); elsewhere (tree mask, not sm_90, head_dim != 128)
    // the mma.sync kernels run, said once.
    const int64_t wgmma_blocks = (p.n_tokens + kWgmmaRowsPerBlock - 1) / kWgmmaRowsPerBlock * p.n_heads;
    const bool wgmma_shape = p.n_tokens >= 64ll * std::max(p.n_seqs, 1) && wgmma_blocks >= n_sms;
    // The wgmma kernel is the warp-specialized one (wgmma_ws: 1.35-1.59x the first, non-specialized wgmma
    // kernel on the H200 over the four benchmark shapes, docs/perf/prefill.md; issue 31 retired that one).
    if (force == Force::kWgmmaWs) {
      const char* why = nullptr;
      if (paged_attention_wgmma_supports(p, &why)) return plan_wgmma(p, options);
      MX_WARN_ONCE << "prefill attention: the forced wgmma_ws kernel does not serve this batch (" << why
                   << "); the mma.sync kernel '" << (shared ? "shared" : "warp") << "' runs instead (slower prefill)";
    }
    if (force == Force::kAuto && shared && wgmma_shape) {
      const char* why = nullptr;
      if (paged_attention_wgmma_supports(p, &why)) return plan_wgmma(p, options);
      MX_WARN_ONCE << "prefill attention: the wgmma kernel does not serve this batch (" << why
                   << "); the mma.sync kernels run instead (slower prefill)";
    }
    return shared ? plan_shared(p, n_sms) : plan_warp(p, n_sms, options);
  }
  AttentionLaunch plan;
  const int64_t max_ctx = context_bound(p);
  const int64_t base_blocks = static_cast<int64_t>(p.n_tokens) * p.n_kv_heads;
  if (base_blocks >= 2 * n_sms || max_ctx <= kMinSplitKeys) {
    plan.n_splits = 1;
    plan.split_len = 1 << 30;
    return plan;
  }
  const int64_t want = (2 * n_sms + base_blocks - 1) / base_blocks;
  const int64_t most = (max_ctx + kMinSplitKeys - 1) / kMinSplitKeys;
  int64_t splits = std::min(want, most);
  int64_t len = (max_ctx + splits - 1) / splits;
  len = (len + kKeyTile - 1) / kKeyTile * kKeyTile;
  splits = (max_ctx + len - 1) / len;
  plan.n_splits = static_cast<int>(splits);
  plan.split_len = static_cast<int>(len);
  if (splits > 1)
    plan.workspace_bytes = static_cast<size_t>(p.n_tokens) * p.n_heads * splits * (p.head_dim + 2) * sizeof(float);
  else
    plan.split_len = 1 << 30;
  return plan;
}

void paged_attention_bf16(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                          const int32_t* kv_index, const int32_t* block_tables, void* out, const AttentionParams& p,
                          const AttentionLaunch& plan, void* workspace, cudaStream_t stream) {
  if (p.n_tokens == 0) return;
  MX_CHECK_MSG(p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0 && p.n_heads / p.n_kv_heads <= 32,
               "paged attention: n_heads " << p.n_heads << ", n_kv_heads " << p.n_kv_heads);
  MX_CHECK_MSG(plan.n_splits == 1 || workspace != nullptr, "paged attention: split plan without workspace");
  if (plan.kernel != AttentionKernel::kSimt) {
    if (plan.kernel == AttentionKernel::kWgmmaWs) {
      MX_CHECK_MSG(plan.n_splits == 1, "paged attention: the wgmma kernel has no context split (planner bug)");
      if (plan.fp8_dequant_once)
        paged_attention_wgmma_ws_fp8_dequant_once(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p,
                                                  workspace, plan.workspace_bytes, stream);
      else
        paged_attention_wgmma_ws(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, stream);
      return;
    }
    if (plan.kernel == AttentionKernel::kWarp)
      paged_attention_mma_bf16(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, plan.n_splits,
                               plan.split_len, workspace, stream);
    else {
      MX_CHECK_MSG(p.tree_mask == nullptr,
                   "paged attention: the block-shared kernel cannot apply a tree mask (planner bug)");
      paged_attention_mma_shared_bf16(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p,
                                      plan.n_splits, plan.split_len, workspace, stream);
    }
    if (plan.n_splits > 1) combine(workspace, out, p, plan, stream);
    return;
  }
  switch (p.head_dim) {
    case 16: launch<16>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, plan, workspace, stream); break;
    case 32: launch<32>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, plan, workspace, stream); break;
    case 64: launch<64>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, plan, workspace, stream); break;
    case 128: launch<128>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, plan, workspace, stream); break;
    case 256: launch<256>(q, k_cache, v_cache, token_seq, kv_index, block_tables, out, p, plan, workspace, stream); break;
    default: MX_CHECK_MSG(false, "paged attention: head_dim " << p.head_dim << " is not built (16, 32, 64, 128, 256)");
  }
}

}  // namespace mxserve::kernels::cuda
