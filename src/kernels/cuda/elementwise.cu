// Memory-bound elementwise and row kernels of the CUDA backend: row gather (embedding), RMSNorm,
// partial NeoX RoPE, SwiGLU activation, residual add, paged KV write (bf16 copy or FP8 E4M3 quantization)
// and slot copies, random fill. bf16 storage, fp32
// math, one rounding per output. NOTE: all are simple one-pass kernels with 16-byte accesses where the
// row width allows; fusing them into neighbours (norm + residual, q/k norm + RoPE) is later work.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/rmsnorm_row.cuh"
#include "kernels/cuda/common/rope_neox.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kv_fp8.h"

namespace mxserve::kernels::cuda {

bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("MXSERVE_CUDA_SYNC");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

// One thread per 16-byte chunk (or 4-byte word / byte when the row width is not a multiple of 16).
template <typename Word>
__global__ void gather_rows_kernel(const Word* __restrict__ x, const int32_t* __restrict__ rows,
                                   Word* __restrict__ out, int64_t n_rows, int64_t words_per_row) {
  const int64_t total = n_rows * words_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / words_per_row, c = i % words_per_row;
    out[i] = x[static_cast<int64_t>(rows[r]) * words_per_row + c];
  }
}

// One warp per row, two passes: sum of squares, then scale (the second read hits L1/L2). In place is
// safe: pass 2 reads and writes the same chunks from the same lane.
__global__ void rmsnorm_kernel(const bf16* x, const bf16* __restrict__ w, bf16* out, int64_t rows, int cols,
                               float eps) {
  const int warps = blockDim.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int chunks = cols / 8;
  const bf16* xr = x + row * cols;
  float ss = 0.f;
  for (int c = lane; c < chunks; c += 32) {
    float v[8];
    load8(xr + c * 8, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(cols) + eps);
  bf16* orow = out + row * cols;
  for (int c = lane; c < chunks; c += 32) {
    float v[8], wv[8], o[8];
    load8(xr + c * 8, v);
    load8(w + c * 8, wv);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = wv[j] * (v[j] * inv);
    store8(orow + c * 8, o);
  }
}

// One block of 256 threads per row, the row held in registers (<= kRmsChunks 16-byte chunks per thread,
// cols <= 256 * 8 * kRmsChunks): one read of x instead of two, and at one or a few rows (decode) 8 warps
// share the row's loads instead of one warp looping over 16+ dependent chunks (ncu: the warp-per-row kernel
// took 10.5 us for one 4096-wide row on the H200, latency-bound; it stays for wider rows).
constexpr int kRmsThreads = 256, kRmsChunks = 4;
__global__ void __launch_bounds__(kRmsThreads) rmsnorm_block_kernel(const bf16* x, const bf16* __restrict__ w, bf16* out,
                                                                     int cols, float eps) {
  __shared__ float part[kRmsThreads / 32];
  const int64_t row = blockIdx.x;
  const int chunks = cols / 8;
  const bf16* xr = x + row * cols;
  float v[kRmsChunks][8];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kRmsChunks; ++i) {
    const int c = threadIdx.x + i * kRmsThreads;
    if (c < chunks) {
      load8(xr + c * 8, v[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
    }
  }
  const float inv = block_rms_inv<kRmsThreads>(ss, part, cols, eps);
  store_rmsnorm_row<kRmsThreads, kRmsChunks>(v, inv, w, out + row * cols, chunks);
}

// One block per token (grid-stride): lane j of a warp owns rotary pair j (+ 32 i), computes its sin/cos once
// and applies it to every head the warp walks (warp w: heads w, w + 8, ...). Per head a warp touches two
// contiguous runs of 32 bf16 (v[j], v[j + half]), so accesses coalesce; the angle arithmetic is the CPU
// reference's (inv_freq from a double pow rounded to f32 -- computed once per block into shared memory --
// angle in f32, sincosf: common/rope_neox.cuh, shared with rope_kv_write.cu). The earlier one-thread-per-(token, pair, head) form re-did the double pow and the
// sincos for every head and strided its 2-byte accesses by head_dim: 6.5% of an 8k prefill (docs/perf/prefill.md).
constexpr int kRopeThreads = 256;
__global__ void __launch_bounds__(kRopeThreads) rope_neox_kernel(bf16* x, const int32_t* __restrict__ positions,
                                                                 int64_t n_tokens, RopeParams p) {
  extern __shared__ float inv_freq[];  // [rotary_dim / 2]
  const int half = p.rotary_dim / 2;
  for (int j = threadIdx.x; j < half; j += blockDim.x) inv_freq[j] = rope_inv_freq(j, p.rotary_dim, p.theta);
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    const float pos = static_cast<float>(positions[t]);
    bf16* row = x + t * p.n_heads * p.head_dim;
    for (int j = lane; j < half; j += 32) {
      float s, c;
      rope_sincos(pos, inv_freq[j], &s, &c);
      for (int h = warp; h < p.n_heads; h += n_warps) {
        bf16* v = row + static_cast<int64_t>(h) * p.head_dim;
        const float x1 = to_f32(v[j]), x2 = to_f32(v[j + half]);
        v[j] = to_bf16(rope_rotate_lo(x1, x2, c, s));
        v[j + half] = to_bf16(rope_rotate_hi(x1, x2, c, s));
      }
    }
  }
}

__global__ void silu_mul_kernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out, int64_t n_tokens,
                                int64_t inter) {
  const int64_t total = n_tokens * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / inter, c = i % inter;
    const float g = to_f32(gate_up[t * 2 * inter + c]);
    const float u = to_f32(gate_up[t * 2 * inter + inter + c]);
    out[i] = to_bf16(g / (1.0f + expf(-g)) * u);
  }
}

template <typename T>
__global__ void add_kernel(T* x, const T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = from_f32<T>(to_f32(x[i]) + to_f32(y[i]));
}

// One thread per 8-element chunk of one token's K and V rows.
__global__ void kv_write_kernel(const bf16* __restrict__ k, const bf16* __restrict__ v,
                                const int32_t* __restrict__ slots, bf16* k_cache, bf16* v_cache, int64_t n_tokens,
                                int64_t kv_width) {
  const int64_t chunks = kv_width / 8, total = n_tokens * chunks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / chunks, c = i % chunks;
    if (slots[t] < 0) continue;  // a padding row: not written (the MLA writers' rule)
    const int64_t dst = static_cast<int64_t>(slots[t]) * kv_width + c * 8, src = t * kv_width + c * 8;
    *reinterpret_cast<uint4*>(k_cache + dst) = *reinterpret_cast<const uint4*>(k + src);
    *reinterpret_cast<uint4*>(v_cache + dst) = *reinterpret_cast<const uint4*>(v + src);
  }
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(bf16* out, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = to_bf16((2.0f * u - 1.0f) * scale);
  }
}

}  // namespace

void gather_rows(const void* x, const int32_t* rows, void* out, int64_t n_rows, int64_t row_bytes,
                 cudaStream_t stream) {
  if (n_rows == 0 || row_bytes == 0) return;
  if (row_bytes % 16 == 0) {
    const int64_t w = row_bytes / 16;
    gather_rows_kernel<<<grid_for(n_rows * w), kThreads, 0, stream>>>(static_cast<const uint4*>(x), rows,
                                                                       static_cast<uint4*>(out), n_rows, w);
  } else if (row_bytes % 4 == 0) {
    const int64_t w = row_bytes / 4;
    gather_rows_kernel<<<grid_for(n_rows * w), kThreads, 0, stream>>>(static_cast<const uint32_t*>(x), rows,
                                                                       static_cast<uint32_t*>(out), n_rows, w);
  } else {
    gather_rows_kernel<<<grid_for(n_rows * row_bytes), kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(x), rows, static_cast<uint8_t*>(out), n_rows, row_bytes);
  }
  MX_CUDA_CHECK_LAUNCH();
}

void rmsnorm_bf16(const void* x, const void* w, void* out, int64_t rows, int64_t cols, float eps,
                  cudaStream_t stream) {
  if (rows == 0) return;
  MX_CHECK_MSG(cols % 8 == 0, "rmsnorm_bf16: cols " << cols << " is not a multiple of 8");
  const auto* xb = static_cast<const bf16*>(x);
  const auto* wb = static_cast<const bf16*>(w);
  auto* ob = static_cast<bf16*>(out);
  if (cols <= int64_t{kRmsThreads} * 8 * kRmsChunks && rows <= 0x7fffffff) {
    rmsnorm_block_kernel<<<static_cast<int>(rows), kRmsThreads, 0, stream>>>(xb, wb, ob, static_cast<int>(cols), eps);
  } else {
    constexpr int kWarps = 4;
    rmsnorm_kernel<<<ceil_div(rows, kWarps), kWarps * 32, 0, stream>>>(xb, wb, ob, rows, static_cast<int>(cols), eps);
  }
  MX_CUDA_CHECK_LAUNCH();
}

void rope_neox_bf16(void* x, const int32_t* positions, int64_t n_tokens, const RopeParams& p, cudaStream_t stream) {
  if (n_tokens * (p.rotary_dim / 2) * p.n_heads == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(n_tokens, 65535));
  rope_neox_kernel<<<blocks, kRopeThreads, (p.rotary_dim / 2) * sizeof(float), stream>>>(static_cast<bf16*>(x),
                                                                                          positions, n_tokens, p);
  MX_CUDA_CHECK_LAUNCH();
}

void silu_mul_bf16(const void* gate_up, void* out, int64_t n_tokens, int64_t inter, cudaStream_t stream) {
  if (n_tokens * inter == 0) return;
  silu_mul_kernel<<<grid_for(n_tokens * inter), kThreads, 0, stream>>>(static_cast<const bf16*>(gate_up),
                                                                        static_cast<bf16*>(out), n_tokens, inter);
  MX_CUDA_CHECK_LAUNCH();
}

void add_bf16(void* x, const void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<bf16><<<grid_for(n), kThreads, 0, stream>>>(static_cast<bf16*>(x), static_cast<const bf16*>(y), n);
  MX_CUDA_CHECK_LAUNCH();
}

void add_f32(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<float><<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
  MX_CUDA_CHECK_LAUNCH();
}

void kv_write_bf16(const void* k, const void* v, const int32_t* slot_mapping, void* k_cache, void* v_cache,
                   int64_t n_tokens, int64_t kv_width, cudaStream_t stream) {
  if (n_tokens == 0) return;
  MX_CHECK_MSG(kv_width % 8 == 0, "kv_write_bf16: kv_width " << kv_width);
  kv_write_kernel<<<grid_for(n_tokens * kv_width / 8), kThreads, 0, stream>>>(
      static_cast<const bf16*>(k), static_cast<const bf16*>(v), slot_mapping, static_cast<bf16*>(k_cache),
      static_cast<bf16*>(v_cache), n_tokens, kv_width);
  MX_CUDA_CHECK_LAUNCH();
}

namespace {
// One thread per CHUNK-sized piece of a row; it walks the pairs in order, so a pair that reads a slot an
// earlier pair wrote sees the new value (the piece's reads and writes all happen in this thread).
template <typename Chunk>
__global__ void kv_copy_kernel(const int32_t* __restrict__ src, const int32_t* __restrict__ dst, int64_t n_pairs,
                               Chunk* a, Chunk* b, int64_t row_chunks) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= row_chunks) return;
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int64_t s = src[i], d = dst[i];
    if (s == d) continue;
    a[d * row_chunks + c] = a[s * row_chunks + c];
    if (b != a) b[d * row_chunks + c] = b[s * row_chunks + c];
  }
}

// One warp per (token, kv head, K or V): amax over the head's values, then codes + the scale
// (kernels/kv_fp8.h: the CPU reference's arithmetic, so the bytes are identical).
__global__ void kv_write_fp8_kernel(const bf16* __restrict__ k, const bf16* __restrict__ v,
                                    const int32_t* __restrict__ slots, uint8_t* k_cache, uint8_t* v_cache,
                                    float* k_scales, float* v_scales, int64_t n_tokens, int n_kv_heads, int head_dim) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= n_tokens * n_kv_heads * 2) return;  // whole warps leave together (blockDim is a multiple of 32)
  const bool is_v = (item & 1) != 0;
  const int h = static_cast<int>((item / 2) % n_kv_heads);
  const int64_t t = item / 2 / n_kv_heads;
  const int64_t width = static_cast<int64_t>(n_kv_heads) * head_dim;
  const bf16* x = (is_v ? v : k) + t * width + static_cast<int64_t>(h) * head_dim;
  float amax = 0.f;
  for (int d = lane; d < head_dim; d += 32) amax = fmaxf(amax, fabsf(to_f32(x[d])));
  amax = warp_max(amax);
  const float scale = kv_fp8_scale(amax);
  const int64_t slot = slots[t];
  if (slot < 0) return;  // a padding row: not written
  uint8_t* codes = (is_v ? v_cache : k_cache) + slot * width + static_cast<int64_t>(h) * head_dim;
  for (int d = lane; d < head_dim; d += 32) codes[d] = kv_fp8_quantize(to_f32(x[d]), scale);
  if (lane == 0) (is_v ? v_scales : k_scales)[slot * n_kv_heads + h] = scale;
}
}  // namespace

void kv_copy_rows(const int32_t* src_slots, const int32_t* dst_slots, int64_t n_pairs, void* a, void* b,
                  int64_t row_bytes, cudaStream_t stream) {
  if (n_pairs == 0 || row_bytes == 0) return;
  if (row_bytes % 16 == 0) {
    const int64_t w = row_bytes / 16;
    kv_copy_kernel<<<grid_for(w), kThreads, 0, stream>>>(src_slots, dst_slots, n_pairs, static_cast<uint4*>(a),
                                                         static_cast<uint4*>(b), w);
  } else if (row_bytes % 4 == 0) {
    const int64_t w = row_bytes / 4;
    kv_copy_kernel<<<grid_for(w), kThreads, 0, stream>>>(src_slots, dst_slots, n_pairs, static_cast<uint32_t*>(a),
                                                         static_cast<uint32_t*>(b), w);
  } else {
    kv_copy_kernel<<<grid_for(row_bytes), kThreads, 0, stream>>>(src_slots, dst_slots, n_pairs,
                                                                 static_cast<uint8_t*>(a), static_cast<uint8_t*>(b),
                                                                 row_bytes);
  }
  MX_CUDA_CHECK_LAUNCH();
}

void kv_write_fp8(const void* k, const void* v, const int32_t* slot_mapping, void* k_cache, void* v_cache,
                  float* k_scales, float* v_scales, int64_t n_tokens, int n_kv_heads, int head_dim,
                  cudaStream_t stream) {
  if (n_tokens == 0) return;
  const int64_t threads = n_tokens * n_kv_heads * 2 * 32;
  kv_write_fp8_kernel<<<ceil_div(threads, kThreads), kThreads, 0, stream>>>(
      static_cast<const bf16*>(k), static_cast<const bf16*>(v), slot_mapping, static_cast<uint8_t*>(k_cache),
      static_cast<uint8_t*>(v_cache), k_scales, v_scales, n_tokens, n_kv_heads, head_dim);
  MX_CUDA_CHECK_LAUNCH();
}

void fill_random_bf16(void* out, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<bf16*>(out), n, seed, scale);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
