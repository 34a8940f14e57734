// Internal to moe_mxfp4/: the arguments every MXFP4 grouped-GEMM variant takes, and each design's
// launchers (one translation unit per design, its instances generated from moe_mxfp4_variants.h).
// One launch covers all active experts (grid.y walks the device-side active list; surplus blocks exit).
//   gate_up (kSwiglu): A = x [T, K] gathered through row_token, W = [E, 2N, K] (gate rows then up rows),
//                      C = act [P, N] = silu(A W_gate^T) * (A W_up^T);  N = inter, K = d_model
//   down (plain):      A = act [P, K] (row = permuted row), W = [E, N, K], C = y [P, N];  N = d_model, K = inter
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_variants.h"

namespace mxserve::kernels::cuda {

struct Mxfp4GemmArgs {
  const bf16* a = nullptr;
  const int32_t* row_token = nullptr;  // gate_up only
  const uint8_t* wq = nullptr;         // u8 [E, rows, K/2]
  const uint8_t* ws = nullptr;         // u8 [E, rows, K/32]
  bf16* c = nullptr;                   // [P, N]
  const int32_t* row_offsets = nullptr;
  const int32_t* active = nullptr;
  const int32_t* n_active = nullptr;
  int max_active = 0;  // grid.y bound: min(E, P)
  int n = 0, k = 0;
  int64_t n_tokens = 0;  // tokens of the call (an expert has at most this many rows when ids are distinct)
  // Direct mode (design 5 only, n_tokens == 1, no permute kernel): block y serves pair y = row y of
  // expert direct_ids[y] (token 0), max_active = top_k; the gate_up launch also writes pair_row[i] = i
  // (pair_row_out) for the un-permute.
  const int32_t* direct_ids = nullptr;
  int32_t* pair_row_out = nullptr;
  int n_experts = 0;  // direct mode: ids outside [0, n_experts) trap, as in the permute kernel
  // Direct mode, down GEMM of design 5 only: fuse the weighted un-permute (out[0] += sum_k w[k] y_k).
  const float* combine_weights = nullptr;  // [top_k]
  bf16* combine_out = nullptr;             // [1, N]
  // Design 5 only (MoeProbe): 0 normal, 1 weight loads only (no dequant / MMA), 2 math only (no weight loads).
  int gv_probe = 0;
  // Design 8 only (W4A8): the A operand as e4m3 codes [rows of a, K] (gate_up: x's token rows, gathered
  // through row_token; down: the permuted rows) and one f32 scale per row (mxfp4_w4a8_quantize_rows).
  const uint8_t* a8 = nullptr;
  const float* a_scale = nullptr;
};

// Programmatic dependent launch (sm_90): the MoE path's kernels after the permute are launched with
// programmaticStreamSerialization, so each one's launch (grid setup, block dispatch) overlaps the end of
// the kernel before it instead of following it (a ~1-2 us gap per boundary, 3 per call; it matters at
// decode, where a whole call is ~20-70 us). Every such kernel calls mxfp4_pdl_wait() before touching
// anything an earlier kernel wrote. Only design 5 triggers early (griddepcontrol.launch_dependents right
// after its own wait, moe_mxfp4_gv.cu), so the GEMM after it may already hold SM resources and stream its
// weights while design 5 runs; every other kernel lets its dependent launch only at its end. A kernel
// launched without the attribute (or on sm_80) treats the wait as a no-op.
__device__ __forceinline__ void mxfp4_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
template <typename... KArgs, typename... Args>
void mxfp4_launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MX_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// ---- the designs' launchers, generated from the variant list (moe_mxfp4_variants.h) ----
// A launcher runs one variant's GEMM: the SwiGLU instance for gate_up (swiglu), the plain one for down.
using Mxfp4GemmLaunch = void (*)(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream);
// Indexed by variant id; a design's array holds only its own rows (nullptr elsewhere).
using Mxfp4Launchers = std::array<Mxfp4GemmLaunch, kMoeMxfp4NumVariants>;

template <MoeMxfp4Design kDesign, template <int, int, int> class Launch, size_t kV>
constexpr Mxfp4GemmLaunch mxfp4_row_launch() {
  constexpr MoeMxfp4VariantInfo r = kMoeMxfp4Variants[kV];
  if constexpr (r.design == kDesign) return &Launch<r.p0, r.p1, r.p2>::run;
  else return nullptr;
}
template <MoeMxfp4Design kDesign, template <int, int, int> class Launch, size_t... kV>
constexpr Mxfp4Launchers mxfp4_rows_of(std::index_sequence<kV...>) {
  return {{mxfp4_row_launch<kDesign, Launch, kV>()...}};
}
// Every row of design kDesign instantiates Launch<P0, P1, P2>::run (and through it the design's kernels):
// a design's translation unit calls this with its launch template; no other list of instances exists.
template <MoeMxfp4Design kDesign, template <int, int, int> class Launch>
constexpr Mxfp4Launchers mxfp4_design_launchers() {
  return mxfp4_rows_of<kDesign, Launch>(std::make_index_sequence<kMoeMxfp4NumVariants>());
}

// Design 2 (tensor cores, mma.sync m16n8k16 bf16; moe_mxfp4_tc.cu): weights stream global -> registers ->
// dequant -> the MMA's A operand (16 weight rows per warp, P0 warps); P1 rows of the expert per pass from
// shared memory.
const Mxfp4Launchers& mxfp4_tc_launchers();
// Design 4 (prefill, tensor cores; moe_mxfp4_pf.cu): 128 weight rows x 16 P0 tokens per block, codes,
// scales and tokens through a 3-stage cp.async ring in shared memory. Needs K % 128 == 0.
const Mxfp4Launchers& mxfp4_pf_launchers();
// Design 5 (decode GEMV, tensor cores; moe_mxfp4_gv.cu): one warp per 16-row tile over all of K, P1 k
// steps of weights in flight in registers, P0 warps (tiles) per block, x read through L1; with combine_out
// set (direct mode, down GEMM) the weighted un-permute is fused; P2 2 splits K over two warps per tile.
// Needs K % 128 == 0.
const Mxfp4Launchers& mxfp4_gv_launchers();
// Design 6 (prefill, Hopper wgmma, W4A16; moe_mxfp4_wg.cu): 128 expert rows x P0 (128 / 256) weight rows per
// block, 2 warpgroups, tokens and dequantized weights in 128-byte swizzled shared memory, P1-stage cp.async
// ring of 64-wide k steps. Needs K % 128 == 0; on a device other than sm_90 it runs pf_t128 (warning once).
const Mxfp4Launchers& mxfp4_wg_launchers();
// Design 8 (prefill, Hopper wgmma, W4A8; moe_mxfp4_wg8.cu): design 6 with e4m3 operands (tokens quantized per
// row by mxfp4_w4a8_quantize_rows, weights converted to e4m3 in shared memory with the E8M0 scales folded in
// exactly), 128-wide k steps of 4 wgmma k32. Needs a8 / a_scale, sm_90 and K % 128 == 0 (mxfp4_wg8_device_ok;
// the dispatcher checks and runs the bf16 design 6 otherwise).
const Mxfp4Launchers& mxfp4_wg8_launchers();
bool mxfp4_wg8_device_ok();
// x bf16 [rows, cols] -> q e4m3 [rows, cols] + scale f32 [rows], per row (kernels/w4a8_fp8.h); cols % 8 == 0.
void mxfp4_w4a8_quantize_rows(const bf16* x, int64_t rows, int cols, uint8_t* q, float* scale, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
