// MXFP4 routed experts (moe_mxfp4.h): the variant registry, the heuristic, and the launch sequence
//   permute (moe/moe_permute.cuh) -> GEMM 1 gate_up + SwiGLU -> GEMM 2 down -> weighted un-permute,
// all on `stream`, no host synchronization, no allocation. Each GEMM runs the variant the plan names.
// The three kernels after the permute are programmatic dependent launches (moe_mxfp4_internal.h).
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe/moe_permute.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"

namespace mxserve::kernels::cuda {
namespace {

// The same list serves both GEMMs (each kernel has a SwiGLU and a plain instance). Order is the tuner's.
//   simt_r4       design 1: CUDA-core GEMV, 4 rows of an expert per weight pass (decode only)
//   tc_w{64,128}_t{T}  design 2: mma.sync, {4,8} warps x 16 weight rows per block, T expert rows per pass
//   dec_s{S}_r{R}      design 3 (decode): design 2's fragments, warps split K (S 128-wide k steps each, all
//                      loads issued up front), R 16-row tiles per block (next tile prefetched), 8 rows a pass;
//                      _o2: two blocks per SM (128 registers), no register double buffer
//   gv_w{W}_d{D}[_k2]  design 5 (decode): one warp per 16-row tile over all of K, D k steps in flight, W
//                      tiles per block, x through L1; at one token the down GEMM fuses the un-permute;
//                      _k2: two warps per tile, each half of K
//   pf_t{T}            design 4 (prefill): 128 weight rows x T tokens per block, codes + scales + tokens
//                      through a 3-stage cp.async ring in shared memory (K % 128 == 0)
// NOTE: names are append-only (tuned tables store them); new variants go at the end.
enum Variant {
  kSimtR4,
  kTcW64T8,
  kTcW128T8,
  kTcW128T16,
  kTcW128T32,
  kTcW128T64,
  kDecS4R2,
  kDecS4R4,
  kDecS8R2,
  kDecS2R4,
  kPfT64,
  kPfT128,
  kDecS4R4O2,
  kDecS2R4O2,
  kDecS8R4O2,
  kGvW4D4,
  kGvW4D8,
  kGvW1D4,
  kGvW1D8,
  kGvW4D4K2,
  kGvW2D8K2,
  kNumVariants
};
const std::vector<std::string> kNames = {"simt_r4",     "tc_w64_t8",   "tc_w128_t8", "tc_w128_t16", "tc_w128_t32",
                                         "tc_w128_t64", "dec_s4_r2",   "dec_s4_r4",  "dec_s8_r2",   "dec_s2_r4",
                                         "pf_t64",      "pf_t128",     "dec_s4_r4_o2", "dec_s2_r4_o2", "dec_s8_r4_o2",
                                         "gv_w4_d4",    "gv_w4_d8",    "gv_w1_d4",   "gv_w1_d8",
                                         "gv_w4_d4_k2", "gv_w2_d8_k2"};

// NOTE: simt_r4 re-streams an expert's weights for every 4 of its rows and is issue-bound past ~2 rows
// (docs/cuda.md), so it is offered only where rows per expert stay small (decode batches).
constexpr int64_t kSimtMaxTokens = 64;
// Design 3 re-streams an expert's weights per pass of 8 rows: decode-sized calls only.
constexpr int64_t kDecMaxTokens = 256;
bool is_gv(int v) { return v >= kGvW4D4 && v <= kGvW2D8K2; }
bool is_dec(int v) { return (v >= kDecS4R2 && v <= kDecS2R4) || (v >= kDecS4R4O2 && v <= kDecS8R4O2); }
int dec_steps(int v) { return v == kDecS2R4 || v == kDecS2R4O2 ? 2 : v == kDecS8R2 || v == kDecS8R4O2 ? 8 : 4; }

void run_gemm(int variant, bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
  switch (variant) {
    case kSimtR4: launch_mxfp4_simt(swiglu, a, stream); return;
    case kTcW64T8: launch_mxfp4_tc<4, 8>(swiglu, a, stream); return;
    case kTcW128T8: launch_mxfp4_tc<8, 8>(swiglu, a, stream); return;
    case kTcW128T16: launch_mxfp4_tc<8, 16>(swiglu, a, stream); return;
    case kTcW128T32: launch_mxfp4_tc<8, 32>(swiglu, a, stream); return;
    case kTcW128T64: launch_mxfp4_tc<8, 64>(swiglu, a, stream); return;
    case kDecS4R2: launch_mxfp4_dec<4, 2, 1>(swiglu, a, stream); return;
    case kDecS4R4: launch_mxfp4_dec<4, 4, 1>(swiglu, a, stream); return;
    case kDecS8R2: launch_mxfp4_dec<8, 2, 1>(swiglu, a, stream); return;
    case kDecS2R4: launch_mxfp4_dec<2, 4, 1>(swiglu, a, stream); return;
    case kDecS4R4O2: launch_mxfp4_dec<4, 4, 2>(swiglu, a, stream); return;
    case kDecS2R4O2: launch_mxfp4_dec<2, 4, 2>(swiglu, a, stream); return;
    case kDecS8R4O2: launch_mxfp4_dec<8, 4, 2>(swiglu, a, stream); return;
    case kGvW4D4: launch_mxfp4_gv<4, 4, 1>(swiglu, a, stream); return;
    case kGvW4D8: launch_mxfp4_gv<4, 8, 1>(swiglu, a, stream); return;
    case kGvW1D4: launch_mxfp4_gv<1, 4, 1>(swiglu, a, stream); return;
    case kGvW1D8: launch_mxfp4_gv<1, 8, 1>(swiglu, a, stream); return;
    case kGvW4D4K2: launch_mxfp4_gv<4, 4, 2>(swiglu, a, stream); return;
    case kGvW2D8K2: launch_mxfp4_gv<2, 8, 2>(swiglu, a, stream); return;
    case kPfT64: launch_mxfp4_pf<4>(swiglu, a, stream); return;
    case kPfT128: launch_mxfp4_pf<8>(swiglu, a, stream); return;
    default: MX_CHECK_MSG(false, "moe_experts_mxfp4: no variant " << variant);
  }
}

}  // namespace

const std::vector<std::string>& moe_mxfp4_variants(MoeGemm) { return kNames; }

int moe_mxfp4_variant_index(MoeGemm gemm, const std::string& name) {
  const auto& v = moe_mxfp4_variants(gemm);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == name) return static_cast<int>(i);
  return -1;
}

bool moe_mxfp4_variant_supports(MoeGemm gemm, int variant, const MoeShape& s) {
  if (variant < 0 || variant >= kNumVariants) return false;
  if (s.d_model % 32 != 0 || s.inter % 32 != 0 || s.d_model <= 0 || s.inter <= 0) return false;
  const int64_t k = gemm == MoeGemm::kGateUp ? s.d_model : s.inter;
  if (variant == kSimtR4) return s.n_tokens <= kSimtMaxTokens && 4 * 2 * k <= 227 * 1024;
  if (is_dec(variant))  // one k slice per warp, at most 8 warps
    return s.n_tokens <= kDecMaxTokens && (k + 127) / 128 <= 8 * dec_steps(variant);
  if (is_gv(variant)) return s.n_tokens <= kDecMaxTokens && k % 128 == 0;  // whole k steps, aligned scale words
  if (variant == kPfT64 || variant == kPfT128) return k % 128 == 0;  // whole k steps, aligned scale words
  return true;  // tc_*: any N (row guards), any K % 32 == 0 (block guards), any row count (passes)
}

// Heuristic (no tuned table), from the mean rows per active expert r = P / min(E, P): r <= 16 (decode)
// design 5 (gv_w4_d4 / gv_w1_d4) where K % 128 == 0; r > 16 design 4 (pf_t64, pf_t128 from r >= 128) where
// K % 128 == 0; otherwise design 2 (always supported) with the pass width T: 8 for r <= 8 (4-warp blocks
// while P <= 64 so a few experts still spread over all SMs), 16 for r <= 16, 32 for r <= 48, else 64.
MoeMxfp4Plan moe_mxfp4_heuristic_plan(const MoeShape& s) {
  const int64_t P = std::max<int64_t>(1, s.n_tokens * s.top_k);
  const int64_t active = std::max<int64_t>(1, std::min<int64_t>(s.n_experts, P));
  const int64_t r = (P + active - 1) / active;
  int v;
  if (r <= 8) v = P <= 64 ? kTcW64T8 : kTcW128T8;
  else if (r <= 16) v = kTcW128T16;
  else if (r <= 48) v = kTcW128T32;
  else v = kTcW128T64;
  // Decode-sized M: design 5 (the GEMV) where its K % 128 rule holds; the tuner chose it for every bucket
  // up to 128 tokens on all three H200 shapes (docs/perf/moe-mxfp4.md). One token: 4 tiles per block for
  // gate_up (the down GEMM then fuses the weighted un-permute).
  if (r <= 16) {
    const int gv = s.n_tokens == 1 ? kGvW4D4 : kGvW1D4;
    const int g = moe_mxfp4_variant_supports(MoeGemm::kGateUp, gv, s) ? gv : v;
    const int d = moe_mxfp4_variant_supports(MoeGemm::kDown, kGvW1D4, s) ? kGvW1D4 : v;
    return {g, d};
  }
  // Prefill-sized M: the shared-memory tiled design (4) where its K % 128 rule holds; it beat every
  // design-2 tile from M = 512 on both tuned H200 shapes (docs/perf/moe-mxfp4.md).
  const int pf = r >= 128 ? kPfT128 : kPfT64;
  const int g = moe_mxfp4_variant_supports(MoeGemm::kGateUp, pf, s) ? pf : v;
  const int d = moe_mxfp4_variant_supports(MoeGemm::kDown, pf, s) ? pf : v;
  return {g, d};
}

size_t moe_mxfp4_workspace_bytes(const MoeShape& s) { return moe_workspace_layout_bytes(s); }

void moe_experts_mxfp4(const void* x, const int32_t* topk_ids, const float* topk_weights, const MoeMxfp4Weights& w,
                       void* out, const MoeShape& s, const MoeMxfp4Plan& plan, void* workspace, cudaStream_t stream) {
  if (s.n_tokens == 0) return;
  MX_CHECK_MSG(s.d_model % 32 == 0 && s.inter % 32 == 0,
               "moe_experts_mxfp4: d_model " << s.d_model << " and inter " << s.inter << " must be multiples of 32");
  MX_CHECK_MSG(moe_mxfp4_variant_supports(MoeGemm::kGateUp, plan.gate_up, s) &&
                   moe_mxfp4_variant_supports(MoeGemm::kDown, plan.down, s),
               "moe_experts_mxfp4: plan (gate_up " << plan.gate_up << ", down " << plan.down
                                                  << ") not supported for n_tokens " << s.n_tokens << " d_model "
                                                  << s.d_model << " inter " << s.inter);
  MX_CHECK_MSG(w.gate_up_q && w.gate_up_s && w.down_q && w.down_s, "moe_experts_mxfp4: null weight pointer");
  const int64_t P = s.n_tokens * s.top_k;
  MX_CHECK_LT(P, int64_t{1} << 31);
  MX_CHECK_LE(s.n_experts, 4096);
  const MoeWorkspace ws = moe_carve_workspace(workspace, s);
  // NOTE: one token with design 3 or 5 on both GEMMs skips the permute kernel: pair k is row k of expert
  // ids[k] (top-k ids are one row each whether or not they repeat), block y of each GEMM serves pair y.
  const bool direct = s.n_tokens == 1 && (is_dec(plan.gate_up) || is_gv(plan.gate_up)) &&
                      (is_dec(plan.down) || is_gv(plan.down));
  // Design 5's down GEMM fuses the weighted un-permute at one token (out += sum_k w_k y_k): no y, no launch.
  const bool fused_combine = direct && is_gv(plan.down);
  if (!direct) {
    moe_permute_kernel<<<1, kPermuteThreads, 2 * sizeof(int32_t) * s.n_experts, stream>>>(
        topk_ids, P, s.n_experts, s.top_k, 32, ws.row_offsets, ws.tile_offsets, ws.row_token, ws.pair_row, ws.active,
        ws.n_active);
    MX_CUDA_CHECK_LAUNCH();
  }

  Mxfp4GemmArgs g;
  g.row_offsets = ws.row_offsets;
  g.active = ws.active;
  g.n_active = ws.n_active;
  g.max_active = static_cast<int>(direct ? P : std::min<int64_t>(s.n_experts, P));
  g.direct_ids = direct ? topk_ids : nullptr;
  g.pair_row_out = direct ? ws.pair_row : nullptr;
  g.n_experts = s.n_experts;
  g.a = static_cast<const bf16*>(x);
  g.row_token = ws.row_token;
  g.wq = w.gate_up_q;
  g.ws = w.gate_up_s;
  g.c = ws.act;
  g.n = static_cast<int>(s.inter);
  g.k = static_cast<int>(s.d_model);
  g.n_tokens = s.n_tokens;
  if (plan.probe == MoeProbe::kGateUpLoadsOnly || plan.probe == MoeProbe::kGateUpMathOnly) {
    MX_CHECK_MSG(is_gv(plan.gate_up), "moe_experts_mxfp4: the loads/math probes need a gv_* gate_up");
    g.gv_probe = plan.probe == MoeProbe::kGateUpLoadsOnly ? 1 : 2;
  }
  run_gemm(plan.gate_up, true, g, stream);
  if (plan.probe != MoeProbe::kNone) return;  // limit probe: gate_up only
  g.gv_probe = 0;

  g.a = ws.act;
  g.row_token = nullptr;
  g.pair_row_out = nullptr;
  g.wq = w.down_q;
  g.ws = w.down_s;
  g.c = ws.y;
  g.n = static_cast<int>(s.d_model);
  g.k = static_cast<int>(s.inter);
  if (fused_combine) {
    g.combine_weights = topk_weights;
    g.combine_out = static_cast<bf16*>(out);
  }
  run_gemm(plan.down, false, g, stream);
  if (fused_combine) return;

  mxfp4_launch_pdl(moe_unpermute_kernel, dim3(moe_grid_1d(s.n_tokens * s.d_model / 8)), dim3(256), 0, stream,
                   static_cast<const bf16*>(ws.y), static_cast<const int32_t*>(ws.pair_row), topk_weights,
                   static_cast<bf16*>(out), static_cast<int64_t>(s.n_tokens), static_cast<int64_t>(s.d_model),
                   static_cast<int>(s.top_k));
}

}  // namespace mxserve::kernels::cuda
