// The fused RoPE + paged K/V cache write of GQA attention (rope_kv_write.cu): one launch after the one QKV GEMM
// instead of rope(q) + rope(k) + kv_write (and, at more than one row, the column copies out of the GEMM output).
// Invariant: bit for bit what those ops write (common/rope_neox.cuh is the rope kernel's arithmetic; FP8 codes and
// scales come from kernels/kv_fp8.h as in kv_write_fp8), so the CUDA backend may pick either path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/op_params.h"

namespace mxserve::kernels::cuda {

// Whether the CUDA backend's rope_kv_write runs the fused kernel when MXSERVE_FUSED_ROPE_KV is unset (=1 forces
// it, =0 forces the composed ops). true since the GPU oracle passed on an H100 (2026-12-06, commit e1234a3:
// test_cuda_rope_kv_write incl. padding rows, test_cuda_graphs Fixtures/*, test_cuda_fixture, all with the fused
// kernel; docs/perf/decode-path.md).
constexpr bool kFusedRopeKvDefault = true;

// Largest head_dim the kernel's shared memory holds (a K head staged per warp for the FP8 amax).
constexpr int kRopeKvWriteMaxHeadDim = 1024;

// y bf16 [n_tokens, (p.n_heads + 2 n_kv_heads) * p.head_dim] (row-major: q heads | k heads | v heads) ->
//   q_out bf16 [n_tokens, p.n_heads * p.head_dim]: q roped (dims [0, p.rotary_dim) NeoX-rotated, the rest copied);
//   row slot_mapping[t] of k_cache / v_cache [n_slots, n_kv_heads * p.head_dim]: k roped, v as is -- bf16 when
//   k_scales is null, else FP8 E4M3 codes with f32 scales [n_slots, n_kv_heads] in k_scales / v_scales.
// head_dim <= kRopeKvWriteMaxHeadDim, rotary_dim even and <= head_dim (checked here).
void rope_kv_write_bf16(const void* y, const int32_t* positions, int64_t n_tokens, const RopeParams& p,
                        int n_kv_heads, const int32_t* slot_mapping, void* q_out, void* k_cache, void* v_cache,
                        float* k_scales, float* v_scales, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
