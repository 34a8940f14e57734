// rope_kv_write_bf16 (rope_kv_write.h): GQA attention's RoPE + K/V cache write in one launch, reading q | k | v
// straight from the one QKV GEMM's output rows.
// Layout: block (x, y) serves tokens x, x + gridDim.x, ...; per token its threads first compute the sin / cos of
// every rotary pair into shared memory (once per token, not per head), then each warp takes whole "heads" --
// the q heads, then the k heads, then the v heads -- y-strided over the block's warps:
//   q head: rotate its pairs (lane j: dims j and j + rotary_dim / 2), copy dims >= rotary_dim, into q_out;
//   k head: the same into the cache row (bf16), or (FP8) into the warp's shared-memory row as the bf16 values
//           the rope kernel would have stored, then kv_write_fp8_kernel's per-head amax / scale / codes from it;
//   v head: copied (bf16) or quantized (FP8) as kv_write's kernels do.
// Bitwise equal to copy + rope(q) + rope(k) + kv_write: the angle and rotation are common/rope_neox.cuh (the rope
// kernel's), each roped value is rounded to bf16 exactly once, and the FP8 amax runs over those bf16 values in
// kv_write_fp8_kernel's lane order (fmaxf is exact, so the order does not matter anyway).
#include "kernels/cuda/rope_kv_write.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/rope_neox.cuh"
#include "kernels/kv_fp8.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// One warp: the FP8 codes and scale of one head whose values are get(d), d < head_dim (kv_write_fp8_kernel's
// arithmetic: lane-strided amax, warp_max, kv_fp8_scale, kv_fp8_quantize).
template <typename Get>
__device__ __forceinline__ void quantize_head(const Get& get, int head_dim, int lane, uint8_t* codes, float* scale) {
  float amax = 0.f;
  for (int d = lane; d < head_dim; d += 32) amax = fmaxf(amax, fabsf(get(d)));
  amax = warp_max(amax);
  const float s = kv_fp8_scale(amax);
  for (int d = lane; d < head_dim; d += 32) codes[d] = kv_fp8_quantize(get(d), s);
  if (lane == 0) *scale = s;
}

// One warp: head src (head_dim bf16) roped, each output value handed to put(d, bf16 value).
template <typename Put>
__device__ __forceinline__ void rope_head(const bf16* __restrict__ src, const float* cos_t, const float* sin_t,
                                          int half, int rotary_dim, int head_dim, int lane, const Put& put) {
  for (int j = lane; j < half; j += 32) {
    const float x1 = to_f32(src[j]), x2 = to_f32(src[j + half]), c = cos_t[j], s = sin_t[j];
    put(j, to_bf16(rope_rotate_lo(x1, x2, c, s)));
    put(j + half, to_bf16(rope_rotate_hi(x1, x2, c, s)));
  }
  for (int d = rotary_dim + lane; d < head_dim; d += 32) put(d, src[d]);
}

__global__ void __launch_bounds__(kThreads)
    rope_kv_write_kernel(const bf16* __restrict__ y, const int32_t* __restrict__ positions, int64_t n_tokens,
                         RopeParams p, int n_kv_heads, const int32_t* __restrict__ slots, bf16* __restrict__ q_out,
                         void* k_cache, void* v_cache, float* k_scales, float* v_scales) {
  extern __shared__ float smem[];
  const int half = p.rotary_dim / 2, hd = p.head_dim;
  float* inv_freq = smem;         // [half]
  float* cos_t = inv_freq + half;  // [half]: this token's
  float* sin_t = cos_t + half;     // [half]
  float* k_row = sin_t + half;     // [kWarps][hd]: a warp's roped K head (FP8 caches)
  for (int j = threadIdx.x; j < half; j += blockDim.x) inv_freq[j] = rope_inv_freq(j, p.rotary_dim, p.theta);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int nqh = p.n_heads, heads = nqh + 2 * n_kv_heads;
  const int64_t row_width = static_cast<int64_t>(heads) * hd, q_width = static_cast<int64_t>(nqh) * hd;
  const int64_t kv_width = static_cast<int64_t>(n_kv_heads) * hd;
  const bool fp8 = k_scales != nullptr;
  float* my_k_row = k_row + warp * hd;
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    __syncthreads();  // inv_freq is written; the previous token's sin / cos are no longer read
    const float pos = static_cast<float>(positions[t]);
    for (int j = threadIdx.x; j < half; j += blockDim.x) rope_sincos(pos, inv_freq[j], &sin_t[j], &cos_t[j]);
    __syncthreads();
    const bf16* row = y + t * row_width;
    const int64_t slot = slots[t];
    for (int h = static_cast<int>(blockIdx.y) * kWarps + warp; h < heads; h += static_cast<int>(gridDim.y) * kWarps) {
      const bf16* src = row + static_cast<int64_t>(h) * hd;
      if (h < nqh) {
        bf16* dst = q_out + t * q_width + static_cast<int64_t>(h) * hd;
        rope_head(src, cos_t, sin_t, half, p.rotary_dim, hd, lane, [&](int d, bf16 v) { dst[d] = v; });
      } else if (slot < 0) {
        continue;  // a padding row: q is roped, k / v are not written (kv_write's rule)
      } else if (h < nqh + n_kv_heads) {
        const int kh = h - nqh;
        const int64_t at = slot * kv_width + static_cast<int64_t>(kh) * hd;
        if (!fp8) {
          bf16* dst = static_cast<bf16*>(k_cache) + at;
          rope_head(src, cos_t, sin_t, half, p.rotary_dim, hd, lane, [&](int d, bf16 v) { dst[d] = v; });
        } else {
          rope_head(src, cos_t, sin_t, half, p.rotary_dim, hd, lane, [&](int d, bf16 v) { my_k_row[d] = to_f32(v); });
          __syncwarp();
          quantize_head([&](int d) { return my_k_row[d]; }, hd, lane, static_cast<uint8_t*>(k_cache) + at,
                        k_scales + slot * n_kv_heads + kh);
          __syncwarp();  // every lane has read the row before the warp's next K head overwrites it
        }
      } else {
        const int vh = h - nqh - n_kv_heads;
        const int64_t at = slot * kv_width + static_cast<int64_t>(vh) * hd;
        if (!fp8) {
          bf16* dst = static_cast<bf16*>(v_cache) + at;
          for (int d = lane; d < hd; d += 32) dst[d] = src[d];
        } else {
          quantize_head([&](int d) { return to_f32(src[d]); }, hd, lane, static_cast<uint8_t*>(v_cache) + at,
                        v_scales + slot * n_kv_heads + vh);
        }
      }
    }
  }
}

}  // namespace

void rope_kv_write_bf16(const void* y, const int32_t* positions, int64_t n_tokens, const RopeParams& p,
                        int n_kv_heads, const int32_t* slot_mapping, void* q_out, void* k_cache, void* v_cache,
                        float* k_scales, float* v_scales, cudaStream_t stream) {
  if (n_tokens == 0) return;
  MX_CHECK_MSG(p.head_dim > 0 && p.head_dim <= kRopeKvWriteMaxHeadDim && p.rotary_dim % 2 == 0 &&
                   p.rotary_dim >= 0 && p.rotary_dim <= p.head_dim && p.n_heads > 0 && n_kv_heads > 0,
               "rope_kv_write_bf16: head_dim " << p.head_dim << " (<= " << kRopeKvWriteMaxHeadDim << "), rotary_dim "
                                               << p.rotary_dim << ", " << p.n_heads << " q heads, " << n_kv_heads
                                               << " kv heads");
  MX_CHECK_MSG((k_scales == nullptr) == (v_scales == nullptr), "rope_kv_write_bf16: one of k_scales / v_scales is null");
  const int heads = p.n_heads + 2 * n_kv_heads;
  // Tokens along x; at few tokens the heads also spread along y (one warp a head), so a decode step fills more
  // than a handful of SMs: aim at ~1024 blocks in all. Any split writes the same bits (elements are independent).
  const int64_t gx = std::min<int64_t>(n_tokens, 65535);
  const int64_t y_full = (heads + kWarps - 1) / kWarps;
  const int64_t gy = std::max<int64_t>(1, std::min<int64_t>(y_full, (1024 + n_tokens - 1) / n_tokens));
  const size_t smem = sizeof(float) * (3 * static_cast<size_t>(p.rotary_dim / 2) + static_cast<size_t>(kWarps) * p.head_dim);
  rope_kv_write_kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kThreads, smem, stream>>>(
      static_cast<const bf16*>(y), positions, n_tokens, p, n_kv_heads, slot_mapping, static_cast<bf16*>(q_out),
      k_cache, v_cache, k_scales, v_scales);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
