// Greedy decoding on the device: one token id per logits row, so a greedy step copies R x 4 bytes back
// to the host instead of R x V x 4 (151,552-entry vocabularies: 600 KB per row).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxserve::kernels::cuda {

// out[r] = argmax_v logits[r, v] over f32 [rows, V]; ties go to the lowest index (std::max_element's
// rule, which the host sampler uses). NaN entries never win.
void argmax_rows_f32(const float* logits, int32_t* out, int64_t rows, int64_t vocab, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
