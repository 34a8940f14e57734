// MXFP4 routed experts on the GPU (issue 9): the launcher contract between the kernels
// (src/kernels/cuda/moe_mxfp4/*.cu), the offline tuner (`mxserve tune-moe`), the microbenchmark
// (`mxserve bench-kernels moe`) and the CUDA backend's run-time selection (src/kernels/moe_tuning.*).
//
// Layouts (backend::ExpertWeights, ExpertFormat::kMxfp4), E experts, H d_model, I expert width:
//   gate_up_q u8 [E, 2I, H/2]  E2M1 codes, element 2i of a row in the low nibble; rows 0..I-1 gate, I..2I-1 up
//   gate_up_s u8 [E, 2I, H/32] E8M0 scale per 32 consecutive K elements (value = 2^(s - 127), 0xFF = NaN)
//   down_q    u8 [E, H, I/2],  down_s u8 [E, H, I/32]
// x, out bf16 [T, H]; topk_ids i32 / topk_weights f32 [T, K]. H % 32 == 0, I % 32 == 0.
// out[t] += sum_k w[t, k] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, k] (fp32 accumulate).
//
// Kernel variants are named (e.g. "gv_w4_d4", "pf_t128"; the one list is moe_mxfp4_variants.h): the tuned
// tables store the names chosen for each GEMM per token-count bucket, so a table stays readable and a
// renamed or removed variant is caught at load (unknown name -> error naming the table file).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_variants.h"

namespace mxserve::kernels::cuda {

struct MoeMxfp4Weights {
  const uint8_t* gate_up_q = nullptr;
  const uint8_t* gate_up_s = nullptr;
  const uint8_t* down_q = nullptr;
  const uint8_t* down_s = nullptr;
};

// Which variant runs each of the two grouped GEMMs (variant ids: indices into moe_mxfp4_variants(gemm)).
enum class MoeGemm { kGateUp = 0, kDown = 1 };
// Limit probes (`mxserve bench-kernels moe --probe`, never serving): run only the gate_up GEMM, and for a
// design 5 (gv_*) gate_up optionally only its weight stream (no dequant / MMA) or only its math (no weight
// loads), so the time of each part is measured on the real grid.
enum class MoeProbe { kNone = 0, kGateUp, kGateUpLoadsOnly, kGateUpMathOnly };
struct MoeMxfp4Plan {
  int gate_up = 0;
  int down = 0;
  MoeProbe probe = MoeProbe::kNone;
  // Expert parallelism: topk_ids may hold kForeignExpert (-1, moe/moe_expert_range.h), another rank's expert.
  // Such pairs go through the permutation (which skips them), never the one-token direct mode.
  bool foreign_ids = false;
};

// The names of the compiled variants for one GEMM, by id (the tuner's candidate list; the same list serves
// both GEMMs: each variant has a SwiGLU and a plain instance).
const std::vector<std::string>& moe_mxfp4_variants(MoeGemm gemm);
// Id of a variant name; -1 for an unknown name, kMoeMxfp4RetiredVariant (-2) for a retired one
// (kMoeMxfp4RetiredVariants: a table naming it fails validation with that word).
int moe_mxfp4_variant_index(MoeGemm gemm, const std::string& name);
// The largest token count a variant runs this shape at (s.n_tokens is ignored); it runs every count from 1
// up to it. 0: not this shape at all (alignment, tile divisibility). Fixed per shape: the load-time plan
// (kernels/moe_plan.h) resolves it once.
int64_t moe_mxfp4_variant_max_tokens(MoeGemm gemm, int variant, const MoeShape& s);
// Whether a variant can run this shape at s.n_tokens (0 < n_tokens <= max_tokens); the tuner skips the others.
bool moe_mxfp4_variant_supports(MoeGemm gemm, int variant, const MoeShape& s);
// The documented heuristic used for a shape with no tuned table (always supported).
MoeMxfp4Plan moe_mxfp4_heuristic_plan(const MoeShape& s);

// The variant a GEMM whose plan names `variant` runs under s: with s.fp8_activations a design-6 (wg_*)
// variant maps to wg8_n128_s3_m256 where the mean rows per active expert P / min(E, P) >= 256, else to
// wg8_n128_s3 (measured, moe_mxfp4.cu); any other variant (and every variant without the flag) is itself.
// This is the choice before the device check: off sm_90 (or K % 128 != 0) the bf16 wg_* runs, with a warning.
int moe_mxfp4_w4a8_variant(int variant, const MoeShape& s);

// Workspace: the permute bookkeeping and bf16 intermediates, plus (only when s.fp8_activations) the W4A8
// buffers: e4m3 x [T, H] and intermediate [P, I] with one f32 scale per row.
size_t moe_mxfp4_workspace_bytes(const MoeShape& s);
// s.fp8_activations (W4A8, opt-in): each GEMM whose plan variant is design 6 (wg_*) runs the design-8 (wg8_*)
// variant moe_mxfp4_w4a8_variant picks, on per-row FP8 e4m3 activations; every other design runs unchanged in bf16 (decode GEMVs are
// weight-bandwidth bound: FP8 activations would not help). Off sm_90 it warns once and runs bf16.
void moe_experts_mxfp4(const void* x, const int32_t* topk_ids, const float* topk_weights, const MoeMxfp4Weights& w,
                       void* out, const MoeShape& s, const MoeMxfp4Plan& plan, void* workspace, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
