// Row kernels of the MLA + DSA path (glm_moe_dsa) on CUDA: LayerNorm with bias (the indexer key norm),
// GPT-J interleaved RoPE (attention and indexer), a column copy (splitting kv_a's output) and a
// column-offset paged cache write (latent | k_rope rows, indexer keys). bf16 storage, fp32 math, one
// rounding per output, the CPU reference's formulas (kernels/cpu/mla_dsa.cpp). NOTE: simple scalar
// kernels, one thread per element (one warp per row for the norm); fusing them is later work.
#include <cmath>

#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

// One warp per row; three passes over the row (mean, centred variance, write), as the CPU computes them.
// In place is safe: the write pass reads and writes the same element from the same lane.
__global__ void layernorm_kernel(const bf16* x, const bf16* __restrict__ w, const bf16* __restrict__ b, bf16* out,
                                 int64_t rows, int64_t cols, float eps) {
  const int warps = blockDim.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const bf16* xr = x + row * cols;
  float sum = 0.f;
  for (int64_t c = lane; c < cols; c += 32) sum += to_f32(xr[c]);
  const float mean = warp_sum(sum) / static_cast<float>(cols);
  float var = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = to_f32(xr[c]) - mean;
    var += d * d;
  }
  const float inv = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(cols) + eps);
  bf16* o = out + row * cols;
  for (int64_t c = lane; c < cols; c += 32)
    o[c] = to_bf16(((to_f32(xr[c]) - mean) * inv) * to_f32(w[c]) + to_f32(b[c]));
}

// One thread per (token, head, pair). inv_freq as transformers computes it: 1 / theta^(2i / rotary_dim).
__global__ void rope_interleaved_kernel(bf16* x, const int32_t* __restrict__ positions, int64_t n_tokens,
                                        InterleavedRopeParams p) {
  const int half = p.rotary_dim / 2;
  const int64_t total = n_tokens * p.n_heads * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % half);
    const int64_t th = i / half;  // token * n_heads + head
    const int64_t t = th / p.n_heads;
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(p.rotary_dim);
    const float inv_freq = 1.0f / static_cast<float>(pow(static_cast<double>(p.theta), static_cast<double>(exponent)));
    const float angle = static_cast<float>(positions[t]) * inv_freq;
    float s, c;
    sincosf(angle, &s, &c);
    bf16* v = x + th * p.head_stride + p.rot_offset + 2 * j;
    const float x1 = to_f32(v[0]), x2 = to_f32(v[1]);
    v[0] = to_bf16(x1 * c - x2 * s);
    v[1] = to_bf16(x2 * c + x1 * s);
  }
}

__global__ void copy_columns_kernel(const bf16* __restrict__ x, bf16* __restrict__ out, int64_t rows, int64_t cols,
                                    int64_t begin, int64_t width) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = x[(i / width) * cols + begin + i % width];
}

__global__ void cache_write_columns_kernel(const bf16* __restrict__ rows, const int32_t* __restrict__ slot_mapping,
                                           bf16* __restrict__ cache, int64_t n_tokens, int64_t width,
                                           int64_t cache_width, int64_t col_offset) {
  const int64_t total = n_tokens * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / width;
    const int32_t slot = slot_mapping[t];
    if (slot < 0) continue;
    cache[static_cast<int64_t>(slot) * cache_width + col_offset + i % width] = rows[i];
  }
}

}  // namespace

void layernorm_bf16(const void* x, const void* w, const void* b, void* out, int64_t rows, int64_t cols, float eps,
                    cudaStream_t stream) {
  if (rows == 0) return;
  constexpr int kWarps = 8;
  layernorm_kernel<<<ceil_div(rows, kWarps), kWarps * 32, 0, stream>>>(
      static_cast<const bf16*>(x), static_cast<const bf16*>(w), static_cast<const bf16*>(b), static_cast<bf16*>(out),
      rows, cols, eps);
  MX_CUDA_CHECK_LAUNCH();
}

void rope_interleaved_bf16(void* x, const int32_t* positions, int64_t n_tokens, const InterleavedRopeParams& p,
                           cudaStream_t stream) {
  const int64_t total = n_tokens * p.n_heads * (p.rotary_dim / 2);
  if (total == 0) return;
  rope_interleaved_kernel<<<grid_for(total), kThreads, 0, stream>>>(static_cast<bf16*>(x), positions, n_tokens, p);
  MX_CUDA_CHECK_LAUNCH();
}

void copy_columns_bf16(const void* x, void* out, int64_t rows, int64_t cols, int64_t begin, int64_t end,
                       cudaStream_t stream) {
  const int64_t total = rows * (end - begin);
  if (total == 0) return;
  copy_columns_kernel<<<grid_for(total), kThreads, 0, stream>>>(static_cast<const bf16*>(x), static_cast<bf16*>(out),
                                                                rows, cols, begin, end - begin);
  MX_CUDA_CHECK_LAUNCH();
}

void cache_write_columns_bf16(const void* rows, const int32_t* slot_mapping, void* cache, int64_t n_tokens,
                              int64_t width, int64_t cache_width, int64_t col_offset, cudaStream_t stream) {
  const int64_t total = n_tokens * width;
  if (total == 0) return;
  cache_write_columns_kernel<<<grid_for(total), kThreads, 0, stream>>>(
      static_cast<const bf16*>(rows), slot_mapping, static_cast<bf16*>(cache), n_tokens, width, cache_width,
      col_offset);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
