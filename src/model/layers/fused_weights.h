// Load-time weight concatenation for fused projections: several weights that read the same input (glm_moe_dsa's
// q_a | kv_a | indexer wk | weights_proj, glm4_moe's q | k | v) become one tensor, one GEMM per step instead of
// several skinny ones. Invariant: after fuse_rows each part is a row view of the fused tensor (same values,
// no second copy on the device), so the unfused path keeps working on the same weights.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"

namespace mxserve::model {

// Concatenates parts along dim 0 into one new backend tensor and makes each part a row view of it. All parts
// must be contiguous bf16 tensors (f32 too under MXSERVE_FUSED_PROJ=force) with the same rank (1 or 2) and,
// for matrices, the same column count; else returns an undefined Tensor, leaves the parts untouched and says
// why in *why.
Tensor fuse_rows(backend::Backend& be, const std::vector<Tensor*>& parts, std::string* why);

// The switch MXSERVE_FUSED_PROJ: unset / 1 fuses bf16 weights (the CUDA backend), 0 keeps every projection
// its own GEMM, force also fuses f32 weights (the CPU backend: a test of the fused path against the fixtures;
// not the CPU default, which stays the unfused oracle).
bool fused_projections_enabled();
bool fused_projections_forced();  // MXSERVE_FUSED_PROJ=force

// Columns [begin, end) of y [T, N] where T == 1 and begin % 8 == 0 (16-byte aligned bf16): a view of y's
// storage, [1, end - begin]. Else an undefined Tensor (the caller copies or runs the unfused GEMMs).
Tensor row_columns_view(const Tensor& y, int64_t begin, int64_t end);

}  // namespace mxserve::model
