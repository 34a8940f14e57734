// MXFP4 MoE prefill by "dequantize the step's active experts once, then a bf16 tensor-core grouped GEMM"
// (issue 33 item 2, one of its named designs; docs/perf/moe-mxfp4.md "Session 8"). A prototype behind a switch:
//   1. permute (moe/moe_permute.cuh): rows per expert, the ascending list of active experts (on the device);
//   2. dequant (moe_prefill_dequant.cu): for each active expert e (the permute's device-side list) the packed
//      E2M1 codes and E8M0 scales of e's gate_up [2I, H/2] / down [H, I/2] -> bf16 copies wgu[e] [2I, H] and
//      wdn[e] [H, I] (exact: MXFP4 values are bf16-representable), 16-byte code loads, 4 x 16-byte stores;
//   3. grouped GEMM 1 + SwiGLU and grouped GEMM 2 on the bf16 copies (moe_bf16_wg.cu: Hopper wgmma, design 6's
//      128 x BN tile and token loader with the weight operand cp.async'd straight from the copy, no dequant;
//      one block per (expert, weight tile, row tile), expert-major, so an expert's tiles share L2);
//   4. the weighted un-permute.
// No host synchronization, no allocation (CUDA-graph safe). The copies have room for all E experts (indexed by
// expert id; a prefill call of >= 1024 tokens x top 8 can activate every expert anyway): the workspace is large
// (GLM-4.5-Air 4.1 GiB, GLM-5.2 18 GiB) and the dequant writes 4x the MXFP4 bytes per layer per call, so the
// design only pays at large M (the bench measures it; docs/perf/moe-mxfp4.md "Session 8").
// The invariant: the result equals moe_experts_mxfp4 with the same routing up to fp32 summation order (the
// same bf16 weights, bf16 intermediate, fp32 accumulation).
//
// THE SWITCH: off by default (kMoePrefillDequantDefault) until the GPU bench shows it faster; the environment
// variable MXSERVE_MOE_PREFILL_DEQUANT=1 / 0 overrides it per process, KernelOptions::moe_kernel =
// "prefill_dequant" forces it on for one backend; either way only calls of >= kMoePrefillDequantMinTokens
// tokens on an sm_90 device with d_model, inter % 128 == 0 and bf16 activations take it (W4A8, when also asked
// for, wins with a warning; logged once when on).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"

namespace mxserve::kernels::cuda {

inline constexpr bool kMoePrefillDequantDefault = false;
inline constexpr int64_t kMoePrefillDequantMinTokens = 1024;

// The grouped GEMM's kernel: BN weight rows per block (256: 4-stage ring, 1 block / SM; 128: 3-stage ring,
// 2 blocks / SM), both with every warp loading and multiplying (one barrier per k step); or warp_specialized
// (BN 256, 4 stages, a producer warpgroup and two consumer warpgroups on mbarriers; the BN fields are ignored).
// The bench times all three; the backend runs the default plan (the GPU run decides which it should be).
inline constexpr int kMoePrefillDequantDefaultBn = 256;
struct MoePrefillDequantPlan {
  int gate_up_bn = kMoePrefillDequantDefaultBn;
  int down_bn = kMoePrefillDequantDefaultBn;
  bool warp_specialized = false;
};

// Whether the path can run this call (host-only): d_model and inter multiples of 128, n_tokens >= 1,
// n_tokens * top_k < 2^31. The device check (sm_90) is moe_prefill_dequant_device_ok.
bool moe_prefill_dequant_supports(const MoeShape& s);
bool moe_prefill_dequant_device_ok();
// The backend's choice: forced (KernelOptions) or switched on (default / MXSERVE_MOE_PREFILL_DEQUANT), and
// n_tokens >= kMoePrefillDequantMinTokens, supported, sm_90. Says once when on, and once when on but refused.
bool moe_prefill_dequant_enabled(const MoeShape& s, bool forced);

// Workspace: the permute bookkeeping and intermediates of moe_mxfp4_workspace_bytes(s without W4A8) plus
// the bf16 copies of all E experts (both GEMMs).
size_t moe_prefill_dequant_workspace_bytes(const MoeShape& s);

// The whole MoE: out[t] += sum_k w[t, k] * down_e(silu(gate_e x_t) * up_e x_t) (moe_mxfp4.h semantics;
// ids of -1 (kForeignExpert) add nothing). = moe_prefill_dequant_stage then moe_prefill_dequant_gemms.
void moe_experts_mxfp4_prefill_dequant(const void* x, const int32_t* topk_ids, const float* topk_weights,
                                       const MoeMxfp4Weights& w, void* out, const MoeShape& s,
                                       const MoePrefillDequantPlan& plan, void* workspace, cudaStream_t stream);
// The two halves, for the bench's split timing (same workspace; gemms needs a stage on it first).
// stage: permute + dequantization of the active experts into the workspace's copies.
void moe_prefill_dequant_stage(const int32_t* topk_ids, const MoeMxfp4Weights& w, const MoeShape& s,
                               void* workspace, cudaStream_t stream);
// gemms: grouped GEMM 1 (+ SwiGLU), grouped GEMM 2, weighted un-permute into out.
void moe_prefill_dequant_gemms(const void* x, const float* topk_weights, void* out, const MoeShape& s,
                               const MoePrefillDequantPlan& plan, void* workspace, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
