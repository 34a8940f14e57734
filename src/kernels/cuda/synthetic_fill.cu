// The synthetic-weight kernel: one thread per element (kNormal) or per 32-element MXFP4 block, values
// from kernels/synthetic_fill.h (bit-identical to the CPU backend's loops). NOTE: integer-hash bound
// (one 64-bit splitmix per element); a full GLM-4.5-Air (~1e11 values) takes seconds, not minutes.
#include "kernels/cuda/synthetic_fill.h"

#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

__global__ void fill_normal_kernel(SyntheticFill p, void* dst, bool dst_bf16) {
  const int64_t n = p.rows * p.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.cols, c = i - r * p.cols;
    const float v = synth_normal_element(p, r, c);
    if (dst_bf16) static_cast<uint16_t*>(dst)[i] = synth_bf16_bits(v);
    else static_cast<float*>(dst)[i] = v;
  }
}

__global__ void fill_mxfp4_kernel(SyntheticFill p, void* dst, bool dst_bf16, uint8_t* scales) {
  const int64_t nb = p.cols / 32, n = p.rows * nb;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / nb, b = i - r * nb;
    if (p.kind == SyntheticKind::kMxfp4) {
      alignas(16) uint8_t packed[16];
      scales[i] = synth_mxfp4_block(p, r, b, packed, nullptr);
      uint8_t* out = static_cast<uint8_t*>(dst) + i * 16;  // row r, block b: r * cols/2 + b * 16
      if ((reinterpret_cast<uintptr_t>(out) & 15) == 0) {
        *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(packed);
      } else {
        for (int j = 0; j < 16; ++j) out[j] = packed[j];
      }
      continue;
    }
    uint8_t packed[16];
    float deq[32];
    synth_mxfp4_block(p, r, b, packed, deq);
    for (int j = 0; j < 32; ++j) {
      if (dst_bf16) static_cast<uint16_t*>(dst)[i * 32 + j] = synth_bf16_bits(deq[j]);
      else static_cast<float*>(dst)[i * 32 + j] = deq[j];
    }
  }
}

}  // namespace

void synthetic_fill(const SyntheticFill& p, void* dst, bool dst_bf16, uint8_t* scales, cudaStream_t stream) {
  if (p.rows * p.cols == 0) return;
  if (p.kind == SyntheticKind::kNormal) {
    fill_normal_kernel<<<grid_for(p.rows * p.cols), kThreads, 0, stream>>>(p, dst, dst_bf16);
  } else {
    fill_mxfp4_kernel<<<grid_for(p.rows * (p.cols / 32)), kThreads, 0, stream>>>(p, dst, dst_bf16, scales);
  }
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
