// Design 9, the persistent MXFP4 MoE decode path (moe_mxfp4_pd.h): two launches per call, each CTA groups
// the routed pairs by expert in shared memory (no permute kernel), gate_up + SwiGLU over (expert, 8-feature
// tile) work items with K split over the CTA's warps, then down + the weighted per-token combine over
// 16-feature work items, deterministic (fixed summation order, no atomics on outputs).
//
// Fragments are design 5's (moe_mxfp4_gv.cu, docs/cuda.md "K permutation"): weights are the MMA's A
// operand (rows g and g+8 of a 16-row tile), lane (g, t) owns E8M0 block 4s + t of k step s (16 code bytes
// per row, one 128-bit load), tokens are the B operand (n = 8 per MMA, lane g feeds column g). New here:
// each dequantized A fragment feeds TWO column groups (16 tokens), so an expert's tile is streamed and
// dequantized once for all its tokens at decode sizes; the grouping is redone per CTA from topk_ids (<= 512
// pairs: a few hundred cycles), which removes the permute launch and its bookkeeping.
// Invariant: act [P, I] rows are in pair order (row t * top_k + k), written by launch 1 only for pairs whose
// id is not -1, read by launch 2 only for those pairs.
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_pd.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/logging.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/moe/moe_permute.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"
#include "kernels/cuda/moe_mxfp4/mxfp4_dequant.cuh"
#include "kernels/cuda/moe_mxfp4/mxfp4_row_stream.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kPdWarpsPerSm = 16;   // occupancy target of both launches (<= 128 registers a thread)
constexpr int kPdDepth = 4;         // k steps of weights in flight per warp (register ring, as gv_*_d4)
constexpr int kPdColumns = 16;      // tokens of one expert per pass (two MMA column groups)

struct PdArgs {
  const bf16* x;            // [T, H]
  const int32_t* ids;       // [T, K]
  const float* wts;         // [T, K]
  const uint8_t *gu_q, *gu_s, *dn_q, *dn_s;
  bf16* act;                // [P, I], pair order
  bf16* out;                // [T, H], +=
  int n_tokens, top_k, n_experts, d_model, inter;
};

__device__ __forceinline__ void pd_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- grouping: the routed pairs by expert, in shared memory ----
struct PdGroups {
  int32_t cursor[kMoeMxfp4PdMaxExperts];     // counts, then each expert's next free row
  int32_t expert[kMoeMxfp4PdMaxExperts];     // active expert of slot y, ascending
  int32_t begin[kMoeMxfp4PdMaxExperts + 1];  // rows of slot y: [begin[y], begin[y + 1])
  int32_t pair[kMoeMxfp4PdMaxPairs];         // pair (t * top_k + k) of each grouped row, stable order
  int32_t n_active;
};

// Histogram (shared atomics on counts only), a warp-0 scan to row starts and the active list, then a stable
// fill by warp 0 in pair order (match_any ranks within each 32-pair chunk), so a row's position depends on
// the routing alone. Ends with a block barrier.
__device__ void pd_group(PdGroups& gr, const int32_t* __restrict__ ids, int n_pairs, int n_experts) {
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) gr.cursor[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
    const int e = ids[i];
    if (e == -1) continue;                  // another rank's expert (expert parallelism)
    if (e < 0 || e >= n_experts) __trap();  // a corrupt routing id is a bug: fail loudly (as moe_permute)
    atomicAdd(&gr.cursor[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int rows = 0, acts = 0;
    for (int base = 0; base < n_experts; base += 32) {
      const int e = base + lane;
      const int c = e < n_experts ? gr.cursor[e] : 0, a = c > 0 ? 1 : 0;
      int ic = c, ia = a;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int uc = __shfl_up_sync(0xffffffffu, ic, o), ua = __shfl_up_sync(0xffffffffu, ia, o);
        if (lane >= o) {
          ic += uc;
          ia += ua;
        }
      }
      if (a) {
        gr.expert[acts + ia - 1] = e;
        gr.begin[acts + ia - 1] = rows + ic - c;
      }
      if (e < n_experts) gr.cursor[e] = rows + ic - c;
      rows += __shfl_sync(0xffffffffu, ic, 31);
      acts += __shfl_sync(0xffffffffu, ia, 31);
    }
    if (lane == 0) {
      gr.begin[acts] = rows;
      gr.n_active = acts;
    }
    __syncwarp();
    for (int base = 0; base < n_pairs; base += 32) {
      const int i = base + lane;
      const int e = i < n_pairs ? ids[i] : -1;
      const unsigned same = __match_any_sync(0xffffffffu, e);
      const int rank = __popc(same & ((1u << lane) - 1u));
      if (e >= 0) gr.pair[gr.cursor[e] + rank] = i;
      __syncwarp();
      if (e >= 0 && rank == 0) gr.cursor[e] += __popc(same);
      __syncwarp();
    }
  }
  __syncthreads();
}

// ---- the weight stream (one 16-row tile, a range of k steps) ----

using PdStep = Mxfp4RowStep;  // mxfp4_row_stream.cuh
using PdTile = Mxfp4RowStream;

// Rows row_a / row_b (absolute, [E * rows] flattened) of a weight with k columns, k steps [s0, s0 + n).
__device__ __forceinline__ PdTile pd_tile(const uint8_t* wq, const uint8_t* ws, int k, int64_t row_a, int64_t row_b,
                                          int t, int s0, int n) {
  PdTile tl;
  tl.qa = wq + row_a * (k / 2) + 16 * t + 64 * s0;
  tl.qb = wq + row_b * (k / 2) + 16 * t + 64 * s0;
  tl.sa = reinterpret_cast<const uint32_t*>(ws + row_a * (k / 32)) + s0;
  tl.sb = reinterpret_cast<const uint32_t*>(ws + row_b * (k / 32)) + s0;
  tl.n_steps = n;
  return tl;
}

__device__ __forceinline__ void pd_prefetch(const PdTile& tl, PdStep (&ring)[kPdDepth]) {
#pragma unroll
  for (int d = 0; d < kPdDepth; ++d)
    if (d < tl.n_steps) ring[d] = tl.load(d);
}

// 32 activations of one lane for one step (k = 32 (4s + t) .. +32 of a row already offset to the tile's
// first step), through L1: every warp of the expert reads the same lines.
struct PdX {
  uint4 v[4];
};
__device__ __forceinline__ PdX pd_load_x(const bf16* row, int s, int t) {
  PdX x;
  const uint4* p = reinterpret_cast<const uint4*>(row + 32 * (4 * s + t));
#pragma unroll
  for (int q = 0; q < 4; ++q) x.v[q] = __ldg(p + q);
  return x;
}

__device__ __forceinline__ uint32_t pd_word(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// One k step: dequantize each A fragment once, 8 MMAs per column group (kTwo: two groups = 16 tokens).
template <bool kTwoStep, bool kTwo>
__device__ __forceinline__ void pd_mma_step(float (&acc0)[4], float (&acc1)[4], const PdStep& w, const PdX& x0,
                                            const PdX& x1, const Mxfp4Factor& fa, const Mxfp4Factor& fb) {
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    const uint32_t ca = pd_word(w.qa, wi), cb = pd_word(w.qb, wi);
    const uint32_t ca4 = ca << 4, cb4 = cb << 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t a[4];
      mxfp4_a_frag_word<kTwoStep>(ca, ca4, cb, cb4, h, fa, fb, a);
      const uint4& xa = x0.v[wi];
      mma_bf16_m16n8k16(acc0, a, h == 0 ? xa.x : xa.z, h == 0 ? xa.y : xa.w);
      if constexpr (kTwo) {
        const uint4& xb = x1.v[wi];
        mma_bf16_m16n8k16(acc1, a, h == 0 ? xb.x : xb.z, h == 0 ? xb.y : xb.w);
      }
    }
  }
}

template <bool kTwo>
__device__ __forceinline__ void pd_compute_step(float (&acc0)[4], float (&acc1)[4], const PdStep& w, const PdX& x0,
                                                const PdX& x1, int t) {
  const uint32_t ea = (w.sa >> (8 * t)) & 0xFFu, eb = (w.sb >> (8 * t)) & 0xFFu;
  if (__any_sync(0xffffffffu, ea > 128u || eb > 128u)) {  // |w| >= 256: no real checkpoint; exact anyway
    pd_mma_step<true, kTwo>(acc0, acc1, w, x0, x1, mxfp4_factor(ea), mxfp4_factor(eb));
  } else {
    Mxfp4Factor fa, fb;  // 2^(s-1) as bf16x2
    const uint32_t ha = (ea + 126u) << 7, hb = (eb + 126u) << 7;
    fa.f1 = ha | (ha << 16);
    fb.f1 = hb | (hb << 16);
    fa.f2 = fb.f2 = 0;
    fa.two_step = fb.two_step = false;
    pd_mma_step<false, kTwo>(acc0, acc1, w, x0, x1, fa, fb);
  }
}

// Streams the tile's k steps; ring holds steps 0 .. kPdDepth-1 on entry and is free on exit. x0 / x1: the
// lane's activation rows of column groups 0 / 1 (offset to the tile's first step).
template <bool kTwo>
__device__ __forceinline__ void pd_run(float (&acc0)[4], float (&acc1)[4], const PdTile& tl,
                                       PdStep (&ring)[kPdDepth], const bf16* x0, const bf16* x1, int t) {
  const int n = tl.n_steps;
  for (int s0 = 0; s0 < n; s0 += kPdDepth) {
#pragma unroll
    for (int d = 0; d < kPdDepth; ++d) {
      const int s = s0 + d;
      if (s < n) {
        const PdStep w = ring[d];
        if (s + kPdDepth < n) ring[d] = tl.load(s + kPdDepth);  // refill before the math (as gv_*_d4)
        const PdX xa = pd_load_x(x0, s, t);
        PdX xb;
        if constexpr (kTwo) xb = pd_load_x(x1, s, t);
        else xb = xa;
        pd_compute_step<kTwo>(acc0, acc1, w, xa, xb, t);
      }
    }
  }
}

// ---- launch 1: gate_up + SwiGLU ----
// Work item = (active slot y, tile of 8 features: gate rows f0..f0+7 as MMA rows 0..7, up rows as 8..15);
// warp `split` of the CTA takes k steps [split * per, +per); partial sums meet in shared memory and warp 0
// adds them in warp order, applies SwiGLU and stores act[pair, f].
// kSplit (MoeMxfp4PdConfig::gate_up_split): warps per CTA, each 1/kSplit of K of the same tile.
template <int kSplit>
__global__ void __launch_bounds__(kSplit * 32, kPdWarpsPerSm / kSplit) pd_gate_up_kernel(PdArgs p) {
  __shared__ PdGroups gr;
  __shared__ float red[kSplit][2][4][32];
  mxfp4_pdl_wait();  // ids and x come from earlier kernels
  pd_launch_dependents();
  const int n_pairs = p.n_tokens * p.top_k;
  pd_group(gr, p.ids, n_pairs, p.n_experts);
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, split = threadIdx.x / 32;
  const int N = p.inter, H = p.d_model, tiles = N / 8, n_all = H / 128;
  const int per = (n_all + kSplit - 1) / kSplit;
  const int s_begin = min(split * per, n_all), n_steps = min(per, n_all - s_begin);
  const int work = gr.n_active * tiles;
  PdStep ring[kPdDepth];
  bool ring_ready = false;  // ring holds the current item's first steps (prefetched during the last item)
  auto tile_of = [&](int item) {
    const int y = item / tiles, tile = item - y * tiles;
    const int64_t row_a = static_cast<int64_t>(gr.expert[y]) * 2 * N + tile * 8 + g;
    return pd_tile(p.gu_q, p.gu_s, H, row_a, row_a + N, t, s_begin, n_steps);
  };
  for (int item = blockIdx.x; item < work; item += gridDim.x) {
    const int y = item / tiles, tile = item - y * tiles;
    const int begin = gr.begin[y], count = gr.begin[y + 1] - begin;
    const int fa = tile * 8 + g;
    const PdTile tl = tile_of(item);
    for (int r0 = 0; r0 < count; r0 += kPdColumns) {
      if (!ring_ready) pd_prefetch(tl, ring);
      ring_ready = false;
      const bool two = count - r0 > 8;  // CTA-uniform
      const int c0 = r0 + g, c1 = r0 + 8 + g;
      // Columns past the expert's rows read row r0's token (valid memory; MMA columns are independent) and
      // are not stored.
      const int p0 = gr.pair[begin + (c0 < count ? c0 : r0)], p1 = gr.pair[begin + (c1 < count ? c1 : r0)];
      const bf16* x0 = p.x + static_cast<int64_t>(p0 / p.top_k) * H + 128 * s_begin;
      const bf16* x1 = p.x + static_cast<int64_t>(p1 / p.top_k) * H + 128 * s_begin;
      float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
      if (two) pd_run<true>(acc0, acc1, tl, ring, x0, x1, t);
      else pd_run<false>(acc0, acc1, tl, ring, x0, x1, t);
      // The next item's first weight loads go out before this item's reduction.
      const bool last_pass = r0 + kPdColumns >= count;
      if (last_pass && item + static_cast<int>(gridDim.x) < work) {
        pd_prefetch(tile_of(item + gridDim.x), ring);
        ring_ready = true;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        red[split][0][i][lane] = acc0[i];
        red[split][1][i][lane] = acc1[i];
      }
      __syncthreads();
      if (split == 0) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (c == 1 && !two) break;
          float v[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            v[i] = 0.f;
#pragma unroll
            for (int w2 = 0; w2 < kSplit; ++w2) v[i] += red[w2][c][i][lane];
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int col = r0 + 8 * c + 2 * t + h;
            if (col < count) {
              const float gate = v[h], up = v[2 + h];
              p.act[static_cast<int64_t>(gr.pair[begin + col]) * N + fa] = to_bf16(gate / (1.0f + expf(-gate)) * up);
            }
          }
        }
      }
      __syncthreads();  // red is rewritten by the next pass
    }
  }
}

// ---- launch 2: down + weighted combine ----
// Work item = 16 output features [f0, f0 + 16); warp w takes active slots w, w + W, ... in order; lane (g, t)
// adds w_pair * y[pair, f] of its MMA columns into sacc[warp][token][f] (the lanes of a warp take turns by t,
// so a token routed twice to one expert is still summed in a fixed order); then out[t, f] += sum over warps
// in warp order, one bf16 rounding.
// kPdDownWarps (MoeMxfp4PdConfig::down_warps): warps per CTA, each a subset of the active experts.
template <int kPdDownWarps>
__global__ void __launch_bounds__(kPdDownWarps * 32, kPdWarpsPerSm / kPdDownWarps) pd_down_kernel(PdArgs p) {
  __shared__ PdGroups gr;
  __shared__ float sacc[kPdDownWarps][kMoeMxfp4PdMaxTokens][16];
  const int n_pairs = p.n_tokens * p.top_k;
  // ids were complete before launch 1 passed its wait and let this grid launch: group now, wait for act later.
  pd_group(gr, p.ids, n_pairs, p.n_experts);
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, warp = threadIdx.x / 32;
  const int N = p.d_model, I = p.inter, T = p.n_tokens, tiles = N / 16, n_steps = I / 128;
  bool waited = false;
  PdStep ring[kPdDepth];
  bool ring_ready = false;  // ring holds the next (item, slot)'s first steps, prefetched during the last one
  auto tile_of = [&](int item, int y) {
    const int64_t row_a = static_cast<int64_t>(gr.expert[y]) * N + item * 16 + g;
    return pd_tile(p.dn_q, p.dn_s, I, row_a, row_a + 8, t, 0, n_steps);
  };
  for (int item = blockIdx.x; item < tiles; item += gridDim.x) {
    const int f0 = item * 16;
    for (int i = lane; i < T * 16; i += 32) sacc[warp][i / 16][i % 16] = 0.f;
    __syncwarp();
    for (int y = warp; y < gr.n_active; y += kPdDownWarps) {
      const int begin = gr.begin[y], count = gr.begin[y + 1] - begin;
      const PdTile tl = tile_of(item, y);
      for (int r0 = 0; r0 < count; r0 += kPdColumns) {
        if (!ring_ready) pd_prefetch(tl, ring);
        ring_ready = false;
        if (!waited) {  // the first weight loads are in flight: now wait for launch 1's act
          mxfp4_pdl_wait();
          waited = true;
        }
        const bool two = count - r0 > 8;  // warp-uniform
        const int c0 = r0 + g, c1 = r0 + 8 + g;
        const int p0 = gr.pair[begin + (c0 < count ? c0 : r0)], p1 = gr.pair[begin + (c1 < count ? c1 : r0)];
        const bf16* x0 = p.act + static_cast<int64_t>(p0) * I;
        const bf16* x1 = p.act + static_cast<int64_t>(p1) * I;
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        if (two) pd_run<true>(acc[0], acc[1], tl, ring, x0, x1, t);
        else pd_run<false>(acc[0], acc[1], tl, ring, x0, x1, t);
        if (r0 + kPdColumns >= count) {  // last pass: this warp's next slot (or next item's first) goes out now
          int next_item = item, next_y = y + kPdDownWarps;
          if (next_y >= gr.n_active) {
            next_item = item + static_cast<int>(gridDim.x);
            next_y = warp;
          }
          if (next_item < tiles && next_y < gr.n_active) {
            pd_prefetch(tile_of(next_item, next_y), ring);
            ring_ready = true;
          }
        }
        for (int tt = 0; tt < 4; ++tt) {
          if (t == tt) {
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int col = r0 + 8 * c + 2 * t + h;
                if (col < count) {
                  const int pair = gr.pair[begin + col];
                  const float wt = p.wts[pair];
                  float* row = sacc[warp][pair / p.top_k];
                  row[g] += wt * acc[c][h];
                  row[g + 8] += wt * acc[c][2 + h];
                }
              }
          }
          __syncwarp();
        }
      }
    }
    if (!waited) {  // out is touched only after launch 1 (and everything before it) is complete
      mxfp4_pdl_wait();
      waited = true;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < T * 16; i += blockDim.x) {
      const int tok = i / 16, f = i % 16;
      float s = 0.f;
#pragma unroll
      for (int w2 = 0; w2 < kPdDownWarps; ++w2) s += sacc[w2][tok][f];
      bf16* o = p.out + static_cast<int64_t>(tok) * N + f0 + f;
      *o = to_bf16(to_f32(*o) + s);
    }
    __syncthreads();  // sacc is zeroed by the next item
  }
  if (!waited) mxfp4_pdl_wait();
}

int sm_count() {
  int dev = 0, sms = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  MX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return std::max(sms, 1);
}

}  // namespace

bool moe_mxfp4_pd_supports(const MoeShape& s) {
  const int64_t P = s.n_tokens * s.top_k;
  return s.n_tokens >= 1 && s.n_tokens <= kMoeMxfp4PdMaxTokens && s.top_k >= 1 && P <= kMoeMxfp4PdMaxPairs &&
         s.n_experts >= 1 && s.n_experts <= kMoeMxfp4PdMaxExperts && s.d_model > 0 && s.inter > 0 &&
         s.d_model % 128 == 0 && s.inter % 128 == 0;
}

bool moe_mxfp4_pd_enabled(const MoeShape& s) {
  static const bool kOn = [] {
    const char* v = std::getenv("MXSERVE_MOE_MXFP4_PD");
    if (v == nullptr || *v == '\0') return kMoeMxfp4PdDefault;
    if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0) {
      MX_WARN_ONCE << "MXSERVE_MOE_MXFP4_PD='" << v << "' is not 0 or 1; ignored (the persistent MXFP4 decode "
                   << "kernel stays " << (kMoeMxfp4PdDefault ? "on" : "off") << ")";
      return kMoeMxfp4PdDefault;
    }
    const bool on = v[0] == '1';
    const std::string state =
        on ? "ON for calls of <= " + std::to_string(kMoeMxfp4PdAutoMaxTokens) + " tokens" : std::string("OFF");
    MX_WARN_ONCE << "MXSERVE_MOE_MXFP4_PD=" << v << ": the persistent MXFP4 MoE decode kernel (design 9) is "
                 << state << " (built-in default " << (kMoeMxfp4PdDefault ? "on" : "off") << ")";
    return on;
  }();
  if (!kOn || s.n_tokens > kMoeMxfp4PdAutoMaxTokens) return false;
  if (!moe_mxfp4_pd_supports(s)) {
    MX_WARN_ONCE << "moe_mxfp4: the persistent decode kernel (design 9) is on but cannot run this MoE (n_tokens "
                 << s.n_tokens << ", top_k " << s.top_k << ", n_experts " << s.n_experts << ", d_model " << s.d_model
                 << ", inter " << s.inter << "; needs n_tokens * top_k <= " << kMoeMxfp4PdMaxPairs
                 << ", n_experts <= " << kMoeMxfp4PdMaxExperts
                 << ", d_model and inter multiples of 128): the tuned per-GEMM plan runs instead";
    return false;
  }
  return true;
}

void moe_experts_mxfp4_pd(const void* x, const int32_t* topk_ids, const float* topk_weights,
                          const MoeMxfp4Weights& w, void* out, const MoeShape& s, void* workspace,
                          cudaStream_t stream, const MoeMxfp4PdConfig& cfg) {
  MX_CHECK_MSG(moe_mxfp4_pd_supports(s),
               "moe_experts_mxfp4_pd: unsupported call (n_tokens " << s.n_tokens << " must be 1.."
                   << kMoeMxfp4PdMaxTokens << ", n_tokens * top_k " << s.n_tokens * s.top_k << " <= "
                   << kMoeMxfp4PdMaxPairs << ", n_experts " << s.n_experts << " <= " << kMoeMxfp4PdMaxExperts
                   << ", d_model " << s.d_model << " and inter " << s.inter << " multiples of 128)");
  MX_CHECK_MSG(w.gate_up_q && w.gate_up_s && w.down_q && w.down_s, "moe_experts_mxfp4_pd: null weight pointer");
  MX_CHECK_MSG(x && topk_ids && topk_weights && out && workspace,
               "moe_experts_mxfp4_pd: null x / ids / weights / out / workspace");
  auto aligned = [](const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
  MX_CHECK_MSG(aligned(w.gate_up_q, 16) && aligned(w.down_q, 16) && aligned(x, 16) && aligned(w.gate_up_s, 4) &&
                   aligned(w.down_s, 4),
               "moe_experts_mxfp4_pd: misaligned pointer (codes and x need 16 bytes, scales 4)");
  MX_CHECK_MSG(cfg.gate_up_ctas_per_sm >= 0 && cfg.down_ctas_per_sm >= 0,
               "moe_experts_mxfp4_pd: MoeMxfp4PdConfig ctas_per_sm must be >= 0 (0: one resident wave)");
  MX_CHECK_MSG(cfg.gate_up_split == 2 || cfg.gate_up_split == 4 || cfg.gate_up_split == 8,
               "moe_experts_mxfp4_pd: MoeMxfp4PdConfig::gate_up_split " << cfg.gate_up_split << " must be 2, 4 or 8");
  MX_CHECK_MSG(cfg.down_warps == 4 || cfg.down_warps == 8,
               "moe_experts_mxfp4_pd: MoeMxfp4PdConfig::down_warps " << cfg.down_warps << " must be 4 or 8");
  const MoeWorkspace ws = moe_carve_workspace(workspace, s);
  PdArgs a;
  a.x = static_cast<const bf16*>(x);
  a.ids = topk_ids;
  a.wts = topk_weights;
  a.gu_q = w.gate_up_q;
  a.gu_s = w.gate_up_s;
  a.dn_q = w.down_q;
  a.dn_s = w.down_s;
  a.act = ws.act;
  a.out = static_cast<bf16*>(out);
  a.n_tokens = static_cast<int>(s.n_tokens);
  a.top_k = s.top_k;
  a.n_experts = s.n_experts;
  a.d_model = static_cast<int>(s.d_model);
  a.inter = static_cast<int>(s.inter);
  const int sms = sm_count();
  const int64_t max_active = std::min<int64_t>(s.n_experts, s.n_tokens * s.top_k);
  const int64_t gu_items = max_active * (s.inter / 8), dn_items = s.d_model / 16;
  const int gu_per_sm = cfg.gate_up_ctas_per_sm > 0 ? cfg.gate_up_ctas_per_sm : kPdWarpsPerSm / cfg.gate_up_split;
  const int dn_per_sm = cfg.down_ctas_per_sm > 0 ? cfg.down_ctas_per_sm : kPdWarpsPerSm / cfg.down_warps;
  const int gu_grid = static_cast<int>(std::min<int64_t>(gu_items, int64_t{sms} * gu_per_sm));
  const int dn_grid = static_cast<int>(std::min<int64_t>(dn_items, int64_t{sms} * dn_per_sm));
  const dim3 gu_block(cfg.gate_up_split * 32);
  if (cfg.gate_up_split == 2) mxfp4_launch_pdl(pd_gate_up_kernel<2>, dim3(gu_grid), gu_block, 0, stream, a);
  else if (cfg.gate_up_split == 8) mxfp4_launch_pdl(pd_gate_up_kernel<8>, dim3(gu_grid), gu_block, 0, stream, a);
  else mxfp4_launch_pdl(pd_gate_up_kernel<4>, dim3(gu_grid), gu_block, 0, stream, a);
  if (cfg.down_warps == 4) mxfp4_launch_pdl(pd_down_kernel<4>, dim3(dn_grid), dim3(4 * 32), 0, stream, a);
  else mxfp4_launch_pdl(pd_down_kernel<8>, dim3(dn_grid), dim3(8 * 32), 0, stream, a);
}

}  // namespace mxserve::kernels::cuda
