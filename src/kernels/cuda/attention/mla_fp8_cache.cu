// The FP8 latent-cache write of glm_moe_dsa on CUDA (--kv-cache-dtype fp8_e4m3): bf16 rows -> packed FP8
// cache rows (kernels/mla_fp8.h). Codes and scales come from kernels/kv_fp8.h's exact f32 arithmetic, so
// from the same input values this kernel writes the same bytes as the CPU reference (cache_write_fp8_packed,
// kernels/cpu/mla_dsa.cpp); the GPU test compares them byte for byte.
// Quantized part (col_offset 0): one warp per (token, 128-value block): lanes take values lane + 32 i, a
// warp max gives amax, lane 0 writes the f32 scale. Tail (col_offset > 0): one thread per bf16 value.
#include <algorithm>

#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/mla_fp8.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kTailThreads = 256;

__global__ void quantize_rows_kernel(const bf16* __restrict__ rows, const int32_t* __restrict__ slot_mapping,
                                     uint8_t* __restrict__ cache, int64_t n_tokens, int width, int64_t row_bytes) {
  const int n_blocks = static_cast<int>(mla_fp8_n_scales(width));
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (w >= n_tokens * n_blocks) return;
  const int64_t t = w / n_blocks;
  const int blk = static_cast<int>(w % n_blocks);
  const int32_t slot = slot_mapping[t];
  if (slot < 0) return;  // a padding row
  const int b0 = blk * kMlaFp8Block, e = min(width, b0 + kMlaFp8Block);
  float x[kMlaFp8Block / 32];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kMlaFp8Block / 32; ++i) {
    const int c = b0 + lane + 32 * i;
    x[i] = c < e ? to_f32(rows[t * width + c]) : 0.f;
    amax = fmaxf(amax, fabsf(x[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = kv_fp8_scale(amax);
  uint8_t* row = cache + static_cast<int64_t>(slot) * row_bytes;
#pragma unroll
  for (int i = 0; i < kMlaFp8Block / 32; ++i) {
    const int c = b0 + lane + 32 * i;
    if (c < e) row[c] = kv_fp8_quantize(x[i], scale);
  }
  if (lane == 0) *reinterpret_cast<float*>(row + width + 4 * blk) = scale;
}

__global__ void write_tail_kernel(const bf16* __restrict__ rows, const int32_t* __restrict__ slot_mapping,
                                  uint8_t* __restrict__ cache, int64_t n_tokens, int width, int64_t row_bytes,
                                  int64_t tail_offset) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * width) return;
  const int64_t t = i / width;
  const int32_t slot = slot_mapping[t];
  if (slot < 0) return;
  reinterpret_cast<bf16*>(cache + static_cast<int64_t>(slot) * row_bytes + tail_offset)[i % width] = rows[i];
}

}  // namespace

void cache_write_fp8_packed_bf16(const void* rows, const int32_t* slot_mapping, void* cache, int64_t n_tokens,
                                 int64_t width, int64_t row_bytes, int64_t col_offset, cudaStream_t stream) {
  if (n_tokens == 0 || width == 0) return;
  const auto* r = static_cast<const bf16*>(rows);
  auto* c = static_cast<uint8_t*>(cache);
  if (col_offset > 0) {
    const int64_t total = n_tokens * width;
    write_tail_kernel<<<static_cast<unsigned>(ceil_div(total, kTailThreads)), kTailThreads, 0, stream>>>(
        r, slot_mapping, c, n_tokens, static_cast<int>(width), row_bytes, mla_fp8_tail_offset(col_offset));
  } else {
    const int64_t warps = n_tokens * mla_fp8_n_scales(width);
    quantize_rows_kernel<<<static_cast<unsigned>(ceil_div(warps, kWarpsPerBlock)), kWarpsPerBlock * 32, 0, stream>>>(
        r, slot_mapping, c, n_tokens, static_cast<int>(width), row_bytes);
  }
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
