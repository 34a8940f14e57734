// Design 9 of the MXFP4 routed experts (issue 33 item 3, issue 36's batch-1 decode step): the persistent
// decode path, two launches for the whole MoE at 1..kMoeMxfp4PdMaxTokens tokens, no permute kernel, no y
// buffer, no un-permute launch (moe_mxfp4_pd.cu):
//   1. gate_up + SwiGLU: every CTA groups the (token, slot) pairs by expert itself (shared memory, from
//      topk_ids), then walks work items (active expert, 8-feature tile) with a grid-stride loop; a CTA's
//      warps split K of one tile, so at one token 8 experts x I/8 tiles x 4 warps fill the SMs. The weight
//      tile is dequantized once per k step and applied to up to 16 of the expert's tokens (two MMA column
//      groups), so each active expert's weights are read once for all tokens that picked it (an expert with
//      more than 16 tokens re-reads its tile, from L2, per 16). act [P, I] is written in pair order.
//   2. down + weighted combine: work item = 16 output features; warp w of the CTA takes active experts
//      w, w + 8, ...; each pair's down row is scaled by its routing weight and summed per token in shared
//      memory; the warps' sums are added in warp order and out[t] += sum once. No atomics: the summation
//      order is fixed by the routing alone, so results are bitwise reproducible run to run.
// Launch 2 is a programmatic dependent of launch 1 (sm_90): it groups and issues its first weight loads
// before waiting for act. No host synchronization, no allocation: CUDA-graph safe.
//
// Not chosen by default until the GPU suite proves it (test_cuda_moe_mxfp4_pd) and the bench
// (bench_moe_mxfp4_pd) shows it faster: kMoeMxfp4PdDefault is the one-line switch; the environment variable
// MXSERVE_MOE_MXFP4_PD=1 / 0 overrides it per process (logged once).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"

namespace mxserve::kernels::cuda {

// THE SWITCH: true makes the CUDA backend run design 9 for every MXFP4 MoE call it supports of at most
// kMoeMxfp4PdAutoMaxTokens tokens (lower that bound if the bench shows design 9 winning only at small M).
inline constexpr bool kMoeMxfp4PdDefault = false;
inline constexpr int64_t kMoeMxfp4PdAutoMaxTokens = 64;

inline constexpr int64_t kMoeMxfp4PdMaxTokens = 64;  // decode batches
inline constexpr int kMoeMxfp4PdMaxExperts = 512;    // shared-memory grouping tables
inline constexpr int kMoeMxfp4PdMaxPairs = 512;      // n_tokens * top_k

// Launch shape knobs (the bench sweeps them; the defaults are what the backend runs).
struct MoeMxfp4PdConfig {
  // Grids: SMs x ctas_per_sm CTAs (capped by the work items); 0 = one resident wave (16 warps per SM: 16 / warps
  // per CTA); more queue behind the resident ones.
  int gate_up_ctas_per_sm = 0;
  int down_ctas_per_sm = 0;
  int gate_up_split = 4;  // launch 1: warps per CTA splitting K of one 8-feature tile: 2, 4 or 8
  int down_warps = 8;     // launch 2: warps per CTA sharing a 16-feature item's experts: 4 or 8 (4: twice the
                          // CTAs per wave, each warp twice the experts; less tail when items exceed one wave)
};

// Whether design 9 can run this call: 1 <= n_tokens <= 64, n_tokens * top_k <= 512, n_experts <= 512,
// d_model and inter multiples of 128. Host-only, no device query.
bool moe_mxfp4_pd_supports(const MoeShape& s);
// The backend's choice: supported, n_tokens <= kMoeMxfp4PdAutoMaxTokens and switched on (kMoeMxfp4PdDefault,
// or MXSERVE_MOE_MXFP4_PD).
bool moe_mxfp4_pd_enabled(const MoeShape& s);

// out[t] += sum_k w[t, k] * down_e(silu(gate_e x_t) * up_e x_t), as moe_experts_mxfp4 (layouts in
// moe_mxfp4.h); ids of -1 (another rank's expert) add nothing. workspace: moe_mxfp4_workspace_bytes(s)
// (only its act [P, I] part is used). Errors (unsupported shape, misaligned pointer) name the field.
void moe_experts_mxfp4_pd(const void* x, const int32_t* topk_ids, const float* topk_weights,
                          const MoeMxfp4Weights& w, void* out, const MoeShape& s, void* workspace,
                          cudaStream_t stream, const MoeMxfp4PdConfig& cfg = {});

}  // namespace mxserve::kernels::cuda
