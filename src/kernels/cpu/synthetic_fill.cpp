// Host loops of the synthetic-weight generator (kernels/synthetic_fill.h): the CPU backend's
// fill_synthetic and the host-side generation (tests, the fp8-block host path). Same bits as the CUDA kernel.
#include "kernels/synthetic_fill.h"

#include <cstring>

#include "core/check.h"

namespace mxserve::kernels::cpu {

void synthetic_fill(const SyntheticFill& p, void* dst, bool dst_bf16, uint8_t* scales) {
  const int64_t rows = p.rows, cols = p.cols;
  if (p.kind == SyntheticKind::kNormal) {
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = synth_normal_element(p, r, c);
        if (dst_bf16) static_cast<uint16_t*>(dst)[r * cols + c] = synth_bf16_bits(v);
        else static_cast<float*>(dst)[r * cols + c] = v;
      }
    }
    return;
  }
  // Whole 32-element blocks of the logical rows: whole rows, or a rank's window on block boundaries.
  MX_CHECK_MSG(cols % 32 == 0 && p.src_cols % 32 == 0 && p.col_offset % 32 == 0,
               "synthetic mxfp4 fill: cols " << cols << " at " << p.col_offset << " of " << p.src_cols
                                             << " (whole 32-element blocks)");
  const int64_t nb = cols / 32;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t packed[16];
    float deq[32];
    for (int64_t b = 0; b < nb; ++b) {
      if (p.kind == SyntheticKind::kMxfp4) {
        scales[r * nb + b] = synth_mxfp4_block(p, r, b, static_cast<uint8_t*>(dst) + r * (cols / 2) + b * 16, nullptr);
        continue;
      }
      synth_mxfp4_block(p, r, b, packed, deq);
      for (int i = 0; i < 32; ++i) {
        const int64_t j = r * cols + b * 32 + i;
        if (dst_bf16) static_cast<uint16_t*>(dst)[j] = synth_bf16_bits(deq[i]);
        else static_cast<float*>(dst)[j] = deq[i];
      }
    }
  }
}

}  // namespace mxserve::kernels::cpu
