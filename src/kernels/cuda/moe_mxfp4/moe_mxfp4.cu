// MXFP4 routed experts (moe_mxfp4.h): the variant registry and dispatch (both generated from the one list in
// moe_mxfp4_variants.h), the support rule, the heuristic, and the launch sequence
//   permute (moe/moe_permute.cuh) -> GEMM 1 gate_up + SwiGLU -> GEMM 2 down -> weighted un-permute,
// all on `stream`, no host synchronization, no allocation. Each GEMM runs the variant the plan names.
// The three kernels after the permute are programmatic dependent launches (moe_mxfp4_internal.h).
// W4A8 (MoeShape::fp8_activations, opt-in): each GEMM whose plan variant is design 6 (wg_*, the wgmma prefill
// kernel) runs a design-8 variant (wg8_*, chosen by moe_mxfp4_w4a8_variant from the rows per expert) on FP8
// e4m3 activations instead, after a per-row
// quantize pass over its A operand (x, then the SwiGLU intermediate) into workspace buffers that exist only
// then. Every other design (the decode GEMVs, pf_*, tc_*) runs unchanged in bf16: those calls are bound by
// the weight stream, FP8 activations would not make them faster. Off sm_90 W4A8 is refused once (warning)
// and the bf16 plan runs. With fp8_activations false nothing changes and no wg8_* variant is eligible.
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "core/logging.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe/moe_permute.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"

namespace mxserve::kernels::cuda {
namespace {

namespace mv = moe_mxfp4_variant;

// Design 5 re-streams an expert's weights per pass of 8 rows: decode-sized calls only.
constexpr int64_t kDecodeDesignMaxTokens = 256;
constexpr int64_t kNoTokenLimit = std::numeric_limits<int64_t>::max();

MoeMxfp4Design design_of(int v) { return kMoeMxfp4Variants[v].design; }
bool is_gv(int v) { return design_of(v) == MoeMxfp4Design::kGv; }

// The variant of design `to` with the same BN (P0) as v, or -1; preferred: the same stage count (P1) and the
// same P2 (wg8_n128_s3 -> wg_n128_s3: the bf16 fallback of a wg8_* plan off sm_90).
int same_tile_variant(int v, MoeMxfp4Design to) {
  int any = -1, same_s = -1;
  const MoeMxfp4VariantInfo& a = kMoeMxfp4Variants[v];
  for (int c = 0; c < kMoeMxfp4NumVariants; ++c) {
    const MoeMxfp4VariantInfo& b = kMoeMxfp4Variants[c];
    if (design_of(c) != to || b.p0 != a.p0) continue;
    if (b.p1 == a.p1 && b.p2 == a.p2) return c;
    if (b.p1 == a.p1 && same_s < 0) same_s = c;
    if (any < 0) any = c;
  }
  return same_s >= 0 ? same_s : any;
}

// What one GEMM runs: `variant`, on FP8 activations when w4a8 (design 8).
struct GemmChoice {
  int variant;
  bool w4a8;
};
GemmChoice resolve_w4a8(int v, const MoeShape& s, int64_t k) {
  const bool want = design_of(v) == MoeMxfp4Design::kWg8 || (s.fp8_activations && design_of(v) == MoeMxfp4Design::kWg);
  if (!want) return {v, false};
  const int v8 = moe_mxfp4_w4a8_variant(v, s);
  const int v16 = design_of(v) == MoeMxfp4Design::kWg ? v : same_tile_variant(v, MoeMxfp4Design::kWg);
  MX_CHECK_MSG(v8 >= 0 && v16 >= 0, "moe_experts_mxfp4: variant " << kMoeMxfp4Variants[v].name
                                                                  << " has no wg_* / wg8_* counterpart of its BN");
  if (!mxfp4_wg8_device_ok() || k % 128 != 0) {
    MX_WARN_ONCE << "moe_mxfp4: W4A8 (fp8_activations) needs an sm_90 device and K % 128 == 0 (K " << k
                 << "); running the bf16 " << kMoeMxfp4Variants[v16].name
                 << " instead (turn fp8 activations off to silence this)";
    return {v16, false};
  }
  return {v8, true};
}

// The FP8 buffers of W4A8, after the standard workspace (only when s.fp8_activations).
struct W4a8Workspace {
  uint8_t* x8;      // [T, H] e4m3
  float* x_scale;   // [T]
  uint8_t* act8;    // [P, I] e4m3
  float* act_scale;  // [P]
};
size_t w4a8_workspace_bytes(const MoeShape& s) {
  if (!s.fp8_activations) return 0;
  const int64_t P = s.n_tokens * s.top_k;
  return moe_align_up(s.n_tokens * s.d_model) + moe_align_up(4 * s.n_tokens) + moe_align_up(P * s.inter) +
         moe_align_up(4 * P);
}
W4a8Workspace carve_w4a8(void* workspace, const MoeShape& s) {
  const int64_t P = s.n_tokens * s.top_k;
  char* p = static_cast<char*>(workspace) + moe_workspace_layout_bytes(s);
  auto take = [&](size_t bytes) {
    char* r = p;
    p += moe_align_up(bytes);
    return r;
  };
  W4a8Workspace w;
  w.x8 = reinterpret_cast<uint8_t*>(take(s.n_tokens * s.d_model));
  w.x_scale = reinterpret_cast<float*>(take(4 * s.n_tokens));
  w.act8 = reinterpret_cast<uint8_t*>(take(P * s.inter));
  w.act_scale = reinterpret_cast<float*>(take(4 * P));
  return w;
}

// Every variant's launcher, by id: the rows each design's translation unit generated from the list.
Mxfp4Launchers collect_launchers() {
  Mxfp4Launchers all{};
  for (const Mxfp4Launchers* design : {&mxfp4_tc_launchers(), &mxfp4_pf_launchers(), &mxfp4_gv_launchers(),
                                       &mxfp4_wg_launchers(), &mxfp4_wg8_launchers()})
    for (int v = 0; v < kMoeMxfp4NumVariants; ++v)
      if ((*design)[v] != nullptr) all[v] = (*design)[v];
  for (int v = 0; v < kMoeMxfp4NumVariants; ++v)
    MX_CHECK_MSG(all[v] != nullptr, "moe_mxfp4: variant " << kMoeMxfp4Variants[v].name << " (design "
                                                          << static_cast<int>(design_of(v)) << ") has no launcher");
  return all;
}

void run_gemm(int variant, bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
  static const Mxfp4Launchers kLaunchers = collect_launchers();
  MX_CHECK_MSG(variant >= 0 && variant < kMoeMxfp4NumVariants, "moe_experts_mxfp4: no variant " << variant);
  kLaunchers[variant](swiglu, a, stream);
}

std::vector<std::string> variant_names() {
  std::vector<std::string> names;
  for (const MoeMxfp4VariantInfo& v : kMoeMxfp4Variants) names.emplace_back(v.name);
  return names;
}

}  // namespace

const std::vector<std::string>& moe_mxfp4_variants(MoeGemm) {
  static const std::vector<std::string> kNames = variant_names();
  return kNames;
}

int moe_mxfp4_variant_index(MoeGemm, const std::string& name) {
  const int v = moe_mxfp4_variant_id(name);
  return v < 0 && moe_mxfp4_variant_retired(name) ? kMoeMxfp4RetiredVariant : v;
}

int64_t moe_mxfp4_variant_max_tokens(MoeGemm gemm, int variant, const MoeShape& s) {
  if (variant < 0 || variant >= kMoeMxfp4NumVariants) return 0;
  if (s.d_model % 32 != 0 || s.inter % 32 != 0 || s.d_model <= 0 || s.inter <= 0) return 0;
  const int64_t k = gemm == MoeGemm::kGateUp ? s.d_model : s.inter;
  const MoeMxfp4VariantInfo& info = kMoeMxfp4Variants[variant];
  switch (info.design) {
    case MoeMxfp4Design::kGv:  // whole k steps, aligned scale words
      return k % 128 == 0 ? kDecodeDesignMaxTokens : 0;
    case MoeMxfp4Design::kPf: return k % 128 == 0 ? kNoTokenLimit : 0;  // whole k steps, aligned scale words
    case MoeMxfp4Design::kWg: return k % 128 == 0 ? kNoTokenLimit : 0;  // (the launcher checks sm_90 itself)
    case MoeMxfp4Design::kWg8:  // W4A8: only when the caller opted in (never chosen otherwise)
      return s.fp8_activations && k % 128 == 0 ? kNoTokenLimit : 0;
    case MoeMxfp4Design::kTc: return kNoTokenLimit;  // any N (row guards), any K % 32 == 0, any row count
    case MoeMxfp4Design::kPd: return 0;  // no per-GEMM variant (a whole call: moe_mxfp4_pd.h)
  }
  return 0;
}

bool moe_mxfp4_variant_supports(MoeGemm gemm, int variant, const MoeShape& s) {
  const int64_t max_tokens = moe_mxfp4_variant_max_tokens(gemm, variant, s);
  return max_tokens > 0 && s.n_tokens <= max_tokens;
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
  if (r <= 8) v = P <= 64 ? mv::kTcW64T8 : mv::kTcW128T8;
  else if (r <= 16) v = mv::kTcW128T16;
  else if (r <= 48) v = mv::kTcW128T32;
  else v = mv::kTcW128T64;
  // Decode-sized M: design 5 (the GEMV) where its K % 128 rule holds; the tuner chose it for every bucket
  // up to 128 tokens on all three H200 shapes (docs/perf/moe-mxfp4.md). One token: 4 tiles per block for
  // gate_up (the down GEMM then fuses the weighted un-permute).
  if (r <= 16) {
    const int gv = s.n_tokens == 1 ? mv::kGvW4D4 : mv::kGvW1D4;
    const int g = moe_mxfp4_variant_supports(MoeGemm::kGateUp, gv, s) ? gv : v;
    const int d = moe_mxfp4_variant_supports(MoeGemm::kDown, mv::kGvW1D4, s) ? mv::kGvW1D4 : v;
    return {g, d};
  }
  // Prefill-sized M: the shared-memory tiled design (4) where its K % 128 rule holds; it beat every
  // design-2 tile from M = 512 on both tuned H200 shapes (docs/perf/moe-mxfp4.md).
  const int pf = r >= 128 ? mv::kPfT128 : mv::kPfT64;
  const int g = moe_mxfp4_variant_supports(MoeGemm::kGateUp, pf, s) ? pf : v;
  const int d = moe_mxfp4_variant_supports(MoeGemm::kDown, pf, s) ? pf : v;
  return {g, d};
}

// W4A8 mapping of a design-6 plan variant, from the mean rows per active expert r = P / min(E, P) (rounded
// up, as in the heuristic): r >= kWg8M256MinRows wg8_n128_s3_m256 (256-row tiles: the e2m1 -> e4m3 weight
// conversion is amortized over twice the rows, 1 block/SM), else wg8_n128_s3 (128-row tiles, less tail
// waste on small experts). The BN of the wg_* plan is not kept: wg8_n256_s4 was never the fastest.
// Measured whole-MoE W4A8 TFLOP/s on H200 (bench_moe_mxfp4_wg; wg8_n256_s4 / wg8_n128_s3 / wg8_n128_s3_m256):
//   GLM-4.5-Air (E128)  M=2048 (r 128): 327 / 354 / 292   M=8192 (r 512): 448 / 459 / 480
//                       M=16384 (r 1024): 479 / 443 / 518
//   GLM-5.2 (E256)      M=2048 (r 64):  266 / 287 / 177   M=8192 (r 256): 415 / 432 / 459
//                       M=16384 (r 512): 471 / 477 / 541
// Every measured point picks its fastest variant with any threshold in (128, 256]; 256 is the one measured
// r where m256 still wins (GLM-5.2 M=8192, +6%), r 128 the highest where it loses (Air M=2048, -18%).
constexpr int64_t kWg8M256MinRows = 256;

int moe_mxfp4_w4a8_variant(int variant, const MoeShape& s) {
  if (!s.fp8_activations || variant < 0 || variant >= kMoeMxfp4NumVariants ||
      design_of(variant) != MoeMxfp4Design::kWg)
    return variant;
  const int64_t P = std::max<int64_t>(1, s.n_tokens * s.top_k);
  const int64_t active = std::max<int64_t>(1, std::min<int64_t>(s.n_experts, P));
  const int64_t r = (P + active - 1) / active;
  return r >= kWg8M256MinRows ? mv::kWg8N128S3M256 : mv::kWg8N128S3;
}

size_t moe_mxfp4_workspace_bytes(const MoeShape& s) { return moe_workspace_layout_bytes(s) + w4a8_workspace_bytes(s); }

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
  const GemmChoice gu = resolve_w4a8(plan.gate_up, s, s.d_model), dn = resolve_w4a8(plan.down, s, s.inter);
  W4a8Workspace ws8{};
  if (gu.w4a8 || dn.w4a8) {
    MX_CHECK_MSG(s.fp8_activations, "moe_experts_mxfp4: a wg8_* plan needs MoeShape::fp8_activations (workspace)");
    ws8 = carve_w4a8(workspace, s);
  }
  // NOTE: one token with design 5 on both GEMMs skips the permute kernel: pair k is row k of expert
  // ids[k] (top-k ids are one row each whether or not they repeat), block y of each GEMM serves pair y.
  const bool direct = s.n_tokens == 1 && is_gv(plan.gate_up) && is_gv(plan.down) && !plan.foreign_ids;
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
    MX_CHECK_MSG(design_of(plan.gate_up) == MoeMxfp4Design::kGv,
                 "moe_experts_mxfp4: the loads/math probes need a gv_* gate_up");
    g.gv_probe = plan.probe == MoeProbe::kGateUpLoadsOnly ? 1 : 2;
  }
  if (gu.w4a8) {
    mxfp4_w4a8_quantize_rows(static_cast<const bf16*>(x), s.n_tokens, static_cast<int>(s.d_model), ws8.x8,
                             ws8.x_scale, stream);
    g.a8 = ws8.x8;
    g.a_scale = ws8.x_scale;
  }
  run_gemm(gu.variant, true, g, stream);
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
  g.a8 = nullptr;
  g.a_scale = nullptr;
  if (dn.w4a8) {
    mxfp4_w4a8_quantize_rows(ws.act, P, static_cast<int>(s.inter), ws8.act8, ws8.act_scale, stream);
    g.a8 = ws8.act8;
    g.a_scale = ws8.act_scale;
  }
  run_gemm(dn.variant, false, g, stream);
  if (fused_combine) return;

  mxfp4_launch_pdl(moe_unpermute_kernel, dim3(moe_grid_1d(s.n_tokens * s.d_model / 8)), dim3(256), 0, stream,
                   static_cast<const bf16*>(ws.y), static_cast<const int32_t*>(ws.pair_row), topk_weights,
                   static_cast<bf16*>(out), static_cast<int64_t>(s.n_tokens), static_cast<int64_t>(s.d_model),
                   static_cast<int>(s.top_k));
}

}  // namespace mxserve::kernels::cuda
