// A lane's stream over one 16-row tile of MXFP4 weights, one k step (128 k = 64 code bytes per row) at a time,
// shared by the decode GEMV (moe_mxfp4_gv.cu) and design 9 (moe_mxfp4_pd.cu): rows g (a) and g + 8 (b), the
// lane's 16 code bytes of each (E8M0 block 4s + t) and the step's scale word of each (byte t is the lane's block),
// loaded with the streamed loads of common/ld_stream.cuh. The kernels build the row pointers (their own offsets).
#pragma once

#include <cstdint>

#include "kernels/cuda/common/ld_stream.cuh"

namespace mxserve::kernels::cuda {

struct Mxfp4RowStep {
  uint4 qa, qb;     // 16 code bytes of rows g (a) and g + 8 (b)
  uint32_t sa, sb;  // the step's 4 scale bytes of each row
};

struct Mxfp4RowStream {
  const uint8_t *qa, *qb;   // code rows (g, g + 8), offset to this lane's first block (16 t bytes)
  const uint32_t *sa, *sb;  // scale rows as words
  int n_steps;
  __device__ __forceinline__ Mxfp4RowStep load(int s) const {
    Mxfp4RowStep w;
    w.qa = ld_stream16(qa + 64 * s);
    w.qb = ld_stream16(qb + 64 * s);
    w.sa = ld_stream4(sa + s);
    w.sb = ld_stream4(sb + s);
    return w;
  }
};

}  // namespace mxserve::kernels::cuda
