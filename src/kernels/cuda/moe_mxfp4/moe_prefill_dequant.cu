// The MXFP4 prefill dequant path (moe_prefill_dequant.h): the switch, the workspace, the dequantization
// kernel and the launch sequence permute -> dequant gate_up, down -> bf16 grouped GEMMs (moe_bf16_wg.cu) ->
// weighted un-permute, all on `stream`, no host synchronization, no allocation.
// Dequant: one thread per 32-element block (16 code bytes, one E8M0 byte): unit u of an expert's
// [rows, K] weight reads codes u * 16 .. + 15 and scale byte u, and writes bf16 elements u * 32 .. + 31 of the
// copy (4 x 16-byte stores), with the exact bit trick of mxfp4_dequant.cuh. Grid (units / 256, min(E, P));
// block y dequantizes expert e = active[y] into copy e (copies are indexed by expert id; inactive experts' copies
// are never written nor read) and exits past n_active.
#include "kernels/cuda/moe_mxfp4/moe_prefill_dequant.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/logging.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/sm90_device.h"
#include "kernels/cuda/moe/moe_permute.cuh"
#include "kernels/cuda/moe_mxfp4/moe_bf16_wg.h"
#include "kernels/cuda/moe_mxfp4/mxfp4_dequant.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kDequantThreads = 256;

__global__ void __launch_bounds__(kDequantThreads)
    mxfp4_dequant_active_kernel(const uint8_t* __restrict__ q, const uint8_t* __restrict__ sc,
                                const int32_t* __restrict__ active, const int32_t* __restrict__ n_active,
                                int64_t units_per_expert, bf16* __restrict__ out) {
  const int slot = static_cast<int>(blockIdx.y);
  if (slot >= *n_active) return;
  const int64_t e = active[slot];
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x;
  if (u >= units_per_expert) return;
  const int64_t gu = e * units_per_expert + u;
  const uint4 c = __ldg(reinterpret_cast<const uint4*>(q) + gu);
  const Mxfp4Factor f = mxfp4_factor(__ldg(sc + gu));
  uint4* dst = reinterpret_cast<uint4*>(out + gu * 32);
  const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) dst[i] = mxfp4_dequant_word(words[i], f);
}

int64_t max_active_of(const MoeShape& s) { return std::min<int64_t>(s.n_experts, s.n_tokens * s.top_k); }

MoeShape bf16_shape(const MoeShape& s) {  // the bookkeeping layout: never the W4A8 buffers
  MoeShape b = s;
  b.fp8_activations = false;
  return b;
}

struct Copies {
  bf16* gate_up;  // [E, 2I, H] (active experts only written)
  bf16* down;     // [E, H, I]
};
Copies carve_copies(void* workspace, const MoeShape& s) {
  char* p = static_cast<char*>(workspace) + moe_workspace_layout_bytes(bf16_shape(s));
  Copies c;
  c.gate_up = reinterpret_cast<bf16*>(p);
  p += moe_align_up(sizeof(bf16) * s.n_experts * 2 * s.inter * s.d_model);
  c.down = reinterpret_cast<bf16*>(p);
  return c;
}

void dequant_active(const uint8_t* q, const uint8_t* sc, const MoeWorkspace& ws, int64_t rows, int64_t k,
                    int64_t max_active, bf16* out, cudaStream_t stream) {
  const int64_t units = rows * k / 32;
  const dim3 grid(static_cast<unsigned>((units + kDequantThreads - 1) / kDequantThreads),
                  static_cast<unsigned>(max_active));
  mxfp4_dequant_active_kernel<<<grid, kDequantThreads, 0, stream>>>(q, sc, ws.active, ws.n_active, units, out);
  MX_CUDA_CHECK_LAUNCH();
}

void check_call(const MoeShape& s) {
  MX_CHECK_MSG(moe_prefill_dequant_supports(s), "moe_prefill_dequant: cannot run n_tokens "
                                                    << s.n_tokens << " top_k " << s.top_k << " d_model " << s.d_model
                                                    << " inter " << s.inter << " (needs d_model, inter % 128 == 0)");
  MX_CHECK_MSG(moe_prefill_dequant_device_ok(), "moe_prefill_dequant: needs an sm_90 device (wgmma)");
  MX_CHECK_LE(s.n_experts, 4096);
}

bool env_switch() {
  static const bool kOn = [] {
    const char* v = std::getenv("MXSERVE_MOE_PREFILL_DEQUANT");
    if (v == nullptr || *v == '\0') return kMoePrefillDequantDefault;
    if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0) {
      MX_WARN_ONCE << "MXSERVE_MOE_PREFILL_DEQUANT='" << v << "' is not 0 or 1; ignored (the MXFP4 prefill "
                   << "dequant path stays " << (kMoePrefillDequantDefault ? "on" : "off") << ")";
      return kMoePrefillDequantDefault;
    }
    return v[0] == '1';
  }();
  return kOn;
}

}  // namespace

bool moe_prefill_dequant_supports(const MoeShape& s) {
  return s.n_tokens >= 1 && s.top_k >= 1 && s.n_experts >= 1 && s.d_model > 0 && s.inter > 0 &&
         s.d_model % 128 == 0 && s.inter % 128 == 0 && s.n_tokens * s.top_k < (int64_t{1} << 31);
}

bool moe_prefill_dequant_device_ok() { return cuda_device_is_sm90(); }

bool moe_prefill_dequant_enabled(const MoeShape& s, bool forced) {
  if (!forced && !env_switch()) return false;
  if (s.n_tokens < kMoePrefillDequantMinTokens) return false;
  if (s.fp8_activations) {
    MX_WARN_ONCE << "moe_mxfp4: the prefill dequant path is on but W4A8 (fp8 MoE activations) was asked for: "
                    "W4A8 runs (the dequant path is bf16 only; turn one of them off to silence this)";
    return false;
  }
  if (!moe_prefill_dequant_supports(s) || !moe_prefill_dequant_device_ok()) {
    MX_WARN_ONCE << "moe_mxfp4: the prefill dequant path (MXSERVE_MOE_PREFILL_DEQUANT / moe_kernel "
                    "prefill_dequant) is on but cannot run this MoE (d_model "
                 << s.d_model << ", inter " << s.inter << "; needs both % 128 == 0 and an sm_90 device): the "
                 << "tuned MXFP4 plan runs instead";
    return false;
  }
  const char* env = std::getenv("MXSERVE_MOE_PREFILL_DEQUANT");
  const char* why = forced ? "moe_kernel prefill_dequant"
                    : (env != nullptr && *env != '\0') ? "MXSERVE_MOE_PREFILL_DEQUANT=1"
                                                       : "built-in default kMoePrefillDequantDefault";
  MX_WARN_ONCE << "moe_mxfp4: the prefill dequant path is ON (" << why << ") for MoE calls of >= " << kMoePrefillDequantMinTokens
               << " tokens: the step's active experts are dequantized to bf16 (workspace "
               << moe_prefill_dequant_workspace_bytes(s) / (1 << 20) << " MiB at this call) then a bf16 wgmma grouped GEMM";
  return true;
}

size_t moe_prefill_dequant_workspace_bytes(const MoeShape& s) {
  const int64_t e = s.n_experts;
  return moe_workspace_layout_bytes(bf16_shape(s)) + moe_align_up(sizeof(bf16) * e * 2 * s.inter * s.d_model) +
         moe_align_up(sizeof(bf16) * e * s.d_model * s.inter);
}

void moe_prefill_dequant_stage(const int32_t* topk_ids, const MoeMxfp4Weights& w, const MoeShape& s,
                               void* workspace, cudaStream_t stream) {
  if (s.n_tokens == 0) return;
  check_call(s);
  MX_CHECK_MSG(w.gate_up_q && w.gate_up_s && w.down_q && w.down_s, "moe_prefill_dequant: null weight pointer");
  MX_CHECK_MSG(reinterpret_cast<uintptr_t>(w.gate_up_q) % 16 == 0 && reinterpret_cast<uintptr_t>(w.down_q) % 16 == 0,
               "moe_prefill_dequant: the packed codes must be 16-byte aligned");
  const MoeShape b = bf16_shape(s);
  const MoeWorkspace ws = moe_carve_workspace(workspace, b);
  const Copies cp = carve_copies(workspace, s);
  const int64_t P = s.n_tokens * s.top_k;
  moe_permute_kernel<<<1, kPermuteThreads, 2 * sizeof(int32_t) * s.n_experts, stream>>>(
      topk_ids, P, s.n_experts, s.top_k, kMoeBf16WgTileM, ws.row_offsets, ws.tile_offsets, ws.row_token, ws.pair_row, ws.active,
      ws.n_active);
  MX_CUDA_CHECK_LAUNCH();
  const int64_t a = max_active_of(s);
  dequant_active(w.gate_up_q, w.gate_up_s, ws, 2 * s.inter, s.d_model, a, cp.gate_up, stream);
  dequant_active(w.down_q, w.down_s, ws, s.d_model, s.inter, a, cp.down, stream);
}

void moe_prefill_dequant_gemms(const void* x, const float* topk_weights, void* out, const MoeShape& s,
                               const MoePrefillDequantPlan& plan, void* workspace, cudaStream_t stream) {
  if (s.n_tokens == 0) return;
  check_call(s);
  const MoeWorkspace ws = moe_carve_workspace(workspace, bf16_shape(s));
  const Copies cp = carve_copies(workspace, s);
  Mxfp4GemmArgs g;
  g.row_offsets = ws.row_offsets;
  g.active = ws.active;
  g.n_active = ws.n_active;
  g.max_active = static_cast<int>(max_active_of(s));
  g.n_experts = s.n_experts;
  g.n_tokens = s.n_tokens;
  g.a = static_cast<const bf16*>(x);
  g.row_token = ws.row_token;
  g.c = ws.act;
  g.n = static_cast<int>(s.inter);
  g.k = static_cast<int>(s.d_model);
  const int64_t P = s.n_tokens * s.top_k;
  const int64_t max_tiles = (P + kMoeBf16WgTileM - 1) / kMoeBf16WgTileM + max_active_of(s);
  if (plan.warp_specialized) moe_bf16_wg_ws_gemm(true, g, cp.gate_up, ws.tile_offsets, max_tiles, stream);
  else moe_bf16_wg_gemm(true, plan.gate_up_bn, g, cp.gate_up, ws.tile_offsets, max_tiles, stream);
  g.a = ws.act;
  g.row_token = nullptr;
  g.c = ws.y;
  g.n = static_cast<int>(s.d_model);
  g.k = static_cast<int>(s.inter);
  if (plan.warp_specialized) moe_bf16_wg_ws_gemm(false, g, cp.down, ws.tile_offsets, max_tiles, stream);
  else moe_bf16_wg_gemm(false, plan.down_bn, g, cp.down, ws.tile_offsets, max_tiles, stream);
  moe_unpermute_kernel<<<moe_grid_1d(s.n_tokens * s.d_model / 8), 256, 0, stream>>>(
      ws.y, ws.pair_row, topk_weights, static_cast<bf16*>(out), s.n_tokens, s.d_model, static_cast<int>(s.top_k));
  MX_CUDA_CHECK_LAUNCH();
}

void moe_experts_mxfp4_prefill_dequant(const void* x, const int32_t* topk_ids, const float* topk_weights,
                                       const MoeMxfp4Weights& w, void* out, const MoeShape& s,
                                       const MoePrefillDequantPlan& plan, void* workspace, cudaStream_t stream) {
  moe_prefill_dequant_stage(topk_ids, w, s, workspace, stream);
  moe_prefill_dequant_gemms(x, topk_weights, out, s, plan, workspace, stream);
}

}  // namespace mxserve::kernels::cuda
