// Fused residual add + RMSNorm (add_rmsnorm.h): one block of 256 threads per row, the row held in registers.
// Each thread adds its 16-byte chunks of x into the residual, rounds to bf16 (what add_bf16 stores), keeps
// the rounded values, and the block reduces the sum of squares in rmsnorm_block_kernel's order; one launch
// and one read of each input instead of add (read 2, write 1) then rmsnorm (read 1, write 1).
#include "kernels/cuda/add_rmsnorm.h"

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/rmsnorm_row.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace mxserve::kernels::cuda {

namespace {

constexpr int kThreads = 256, kChunks = 4;

__global__ void __launch_bounds__(kThreads) add_rmsnorm_kernel(const bf16* x, bf16* residual, const bf16* __restrict__ w,
                                                               bf16* out, int cols, float eps) {
  __shared__ float part[kThreads / 32];
  const int64_t row = blockIdx.x;
  const int chunks = cols / 8;
  const bf16* xr = x + row * cols;
  bf16* rr = residual + row * cols;
  float v[kChunks][8];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c < chunks) {
      float a[8];
      load8(xr + c * 8, a);
      load8(rr + c * 8, v[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i][j] = __bfloat162float(__float2bfloat16_rn(v[i][j] + a[j]));
      store8(rr + c * 8, v[i]);  // exact: v already holds bf16 values
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
    }
  }
  const float inv = block_rms_inv<kThreads>(ss, part, cols, eps);
  store_rmsnorm_row<kThreads, kChunks>(v, inv, w, out + row * cols, chunks);
}

}  // namespace

int64_t add_rmsnorm_max_fused_cols() { return int64_t{kThreads} * 8 * kChunks; }

void add_rmsnorm_bf16(const void* x, void* residual, const void* w, void* out, int64_t rows, int64_t cols, float eps,
                      cudaStream_t stream) {
  if (rows == 0) return;
  MX_CHECK_MSG(cols % 8 == 0, "add_rmsnorm_bf16: cols " << cols << " is not a multiple of 8");
  if (cols > add_rmsnorm_max_fused_cols() || rows > 0x7fffffff) {  // wide rows: the two kernels
    add_bf16(residual, x, rows * cols, stream);
    rmsnorm_bf16(residual, w, out, rows, cols, eps, stream);
    return;
  }
  add_rmsnorm_kernel<<<static_cast<int>(rows), kThreads, 0, stream>>>(
      static_cast<const bf16*>(x), static_cast<bf16*>(residual), static_cast<const bf16*>(w), static_cast<bf16*>(out),
      static_cast<int>(cols), eps);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
