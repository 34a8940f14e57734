// norm_rope_cache_write_bf16 (mla_key_write.h): one warp per token row. The statistics pass is
// layernorm_kernel's (lane c sums columns c, c + 32, ...; warp_sum), then each lane owns column pairs
// (2q, 2q + 1): it normalizes both (rounded to bf16, as the LayerNorm stores them), rotates the pair when it
// lies in the rotary range (rope_interleaved_kernel's inv_freq / sincosf, rounded again) and stores the pair to
// k and to the cache row. Three launches and two round trips of the row through memory become one.
#include "kernels/cuda/attention/mla_key_write.h"

#include <cmath>

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

__global__ void norm_rope_cache_write_kernel(bf16* k, const bf16* __restrict__ w, const bf16* __restrict__ b,
                                             float eps, const int32_t* __restrict__ positions, InterleavedRopeParams p,
                                             const int32_t* __restrict__ slot_mapping, bf16* __restrict__ cache,
                                             int64_t rows, int64_t cols) {
  const int warps = blockDim.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  bf16* xr = k + row * cols;
  float sum = 0.f;
  for (int64_t c = lane; c < cols; c += 32) sum += to_f32(xr[c]);
  const float mean = warp_sum(sum) / static_cast<float>(cols);
  float var = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = to_f32(xr[c]) - mean;
    var += d * d;
  }
  const float inv = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(cols) + eps);
  __syncwarp();  // every lane has read the row before any lane overwrites it
  const int32_t slot = slot_mapping[row];
  bf16* crow = slot >= 0 ? cache + static_cast<int64_t>(slot) * cols : nullptr;
  for (int64_t q = lane; q < cols / 2; q += 32) {
    const int64_t c0 = 2 * q;
    float v0 = to_f32(to_bf16(((to_f32(xr[c0]) - mean) * inv) * to_f32(w[c0]) + to_f32(b[c0])));
    float v1 = to_f32(to_bf16(((to_f32(xr[c0 + 1]) - mean) * inv) * to_f32(w[c0 + 1]) + to_f32(b[c0 + 1])));
    if (c0 >= p.rot_offset && c0 < p.rot_offset + p.rotary_dim) {
      const int j = static_cast<int>((c0 - p.rot_offset) / 2);
      const float exponent = static_cast<float>(2 * j) / static_cast<float>(p.rotary_dim);
      const float inv_freq =
          1.0f / static_cast<float>(pow(static_cast<double>(p.theta), static_cast<double>(exponent)));
      const float angle = static_cast<float>(positions[row]) * inv_freq;
      float s, c;
      sincosf(angle, &s, &c);
      const float x1 = v0, x2 = v1;
      v0 = to_f32(to_bf16(x1 * c - x2 * s));
      v1 = to_f32(to_bf16(x2 * c + x1 * s));
    }
    const bf16 o0 = to_bf16(v0), o1 = to_bf16(v1);
    xr[c0] = o0;
    xr[c0 + 1] = o1;
    if (crow != nullptr) {
      crow[c0] = o0;
      crow[c0 + 1] = o1;
    }
  }
}

constexpr int kRowThreads = 256, kRowChunks = 4;  // rmsnorm_block_kernel's (elementwise.cu)

__global__ void __launch_bounds__(kRowThreads)
    latent_cache_write_kernel(const bf16* __restrict__ kv, int64_t n_cols, int64_t col0, const bf16* __restrict__ w,
                              int latent, float eps, const int32_t* __restrict__ positions, InterleavedRopeParams p,
                              const int32_t* __restrict__ slot_mapping, bf16* __restrict__ cache) {
  __shared__ float part[kRowThreads / 32];
  const int64_t row = blockIdx.x;
  const int chunks = latent / 8;
  const bf16* xr = kv + row * n_cols + col0;
  const int32_t slot = slot_mapping[row];
  const int R = p.head_stride;
  bf16* crow = cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * (latent + R);
  float v[kRowChunks][8];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kRowChunks; ++i) {
    const int c = threadIdx.x + i * kRowThreads;
    if (c < chunks) {
      load8(xr + c * 8, v[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
    }
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  if (slot < 0) return;  // after the barrier: every thread reached it
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < kRowThreads / 32; ++i) total += part[i];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(latent) + eps);
#pragma unroll
  for (int i = 0; i < kRowChunks; ++i) {
    const int c = threadIdx.x + i * kRowThreads;
    if (c < chunks) {
      float wv[8], o[8];
      load8(w + c * 8, wv);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = wv[j] * (v[i][j] * inv);
      bf16* dst = crow + c * 8;  // the cache row may not be 16-byte aligned for every width: scalar stores
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[j] = to_bf16(o[j]);
    }
  }
  // k_rope: thread j rotates pair j (rope_interleaved_kernel's arithmetic), written after the latent.
  const int half = p.rotary_dim / 2;
  if (static_cast<int>(threadIdx.x) < half) {
    const int j = threadIdx.x;
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(p.rotary_dim);
    const float inv_freq = 1.0f / static_cast<float>(pow(static_cast<double>(p.theta), static_cast<double>(exponent)));
    const float angle = static_cast<float>(positions[row]) * inv_freq;
    float s, c;
    sincosf(angle, &s, &c);
    const bf16* kr = xr + latent + 2 * j;
    const float x1 = to_f32(kr[0]), x2 = to_f32(kr[1]);
    crow[latent + 2 * j] = to_bf16(x1 * c - x2 * s);
    crow[latent + 2 * j + 1] = to_bf16(x2 * c + x1 * s);
  }
}

}  // namespace

int64_t latent_cache_write_max_latent() { return int64_t{kRowThreads} * 8 * kRowChunks; }

void latent_cache_write_bf16(const void* kv, int64_t n_cols, int64_t col0, const void* norm_w, int64_t latent,
                             float eps, const int32_t* positions, const InterleavedRopeParams& p,
                             const int32_t* slot_mapping, void* cache, int64_t n_tokens, cudaStream_t stream) {
  if (n_tokens == 0) return;
  MX_CHECK_MSG(latent % 8 == 0 && latent <= latent_cache_write_max_latent() && col0 % 8 == 0 && n_cols % 8 == 0 &&
                   p.rot_offset == 0 && p.rotary_dim == p.head_stride && p.rotary_dim % 2 == 0 &&
                   p.rotary_dim / 2 <= kRowThreads && n_tokens <= 0x7fffffff,
               "latent_cache_write_bf16: latent " << latent << " at column " << col0 << " of " << n_cols
                                                  << ", rope " << p.rotary_dim << " (stride " << p.head_stride << ")");
  latent_cache_write_kernel<<<static_cast<int>(n_tokens), kRowThreads, 0, stream>>>(
      static_cast<const bf16*>(kv), n_cols, col0, static_cast<const bf16*>(norm_w), static_cast<int>(latent), eps,
      positions, p, slot_mapping, static_cast<bf16*>(cache));
  MX_CUDA_CHECK_LAUNCH();
}

void norm_rope_cache_write_bf16(void* k, const void* w, const void* b, float eps, const int32_t* positions,
                                const InterleavedRopeParams& p, const int32_t* slot_mapping, void* cache,
                                int64_t n_tokens, int64_t cols, cudaStream_t stream) {
  if (n_tokens == 0) return;
  MX_CHECK_MSG(cols % 2 == 0 && p.rot_offset % 2 == 0 && p.rotary_dim % 2 == 0,
               "norm_rope_cache_write_bf16: cols " << cols << ", rotary dims [" << p.rot_offset << ", +"
                                                   << p.rotary_dim << ") must be even");
  constexpr int kWarps = 8;
  norm_rope_cache_write_kernel<<<static_cast<int>((n_tokens + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(
      static_cast<bf16*>(k), static_cast<const bf16*>(w), static_cast<const bf16*>(b), eps, positions, p,
      slot_mapping, static_cast<bf16*>(cache), n_tokens, cols);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
