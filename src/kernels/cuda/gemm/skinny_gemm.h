// Skinny dense bf16 GEMM for decode-sized M (1..8 rows): out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]), bf16
// inputs, fp32 accumulation (tensor cores), bf16 or f32 output. One kernel per call: the split over K
// happens inside a block and is reduced in shared memory, so there is no separate split-K reduce launch
// (cuBLASLt's choice at M = 1 costs a splitKreduce_kernel per GEMM). The weight is read exactly once.
// Used by LtGemm::run when M <= kSkinnyMaxRows and skinny_gemm_supports() holds; cuBLASLt otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxserve::kernels::cuda {

inline constexpr int64_t kSkinnyMaxRows = 8;

// The shapes and pointers the kernel handles: 1 <= m <= 8, k % 64 == 0, n >= 1, x / w 16-byte aligned,
// out 4-byte (bf16: 2-byte) aligned, bias 2-byte aligned. Returns nullptr when supported, else the reason.
const char* skinny_gemm_unsupported_reason(const void* x, const void* w, const void* bias, const void* out,
                                           int64_t m, int64_t n, int64_t k);

// Launches the kernel on `stream` (asynchronous, no allocation). Precondition: skinny_gemm_unsupported_reason(...) == nullptr (checked again here).
void skinny_gemm_bf16(const void* x, const void* w, const void* bias, void* out, bool out_f32, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
