// MoE router selection on the GPU: sigmoid scores, + e_score_correction_bias for selection only,
// group-limited top-k (DeepSeek-V3 "noaux_tc"), weights = the unbiased scores of the chosen experts,
// normalized and scaled. One warp per token; scores live in shared memory. The rule is bit-for-bit the
// CPU reference's: group score = sum of the group's top two (the same sequential scan), groups and
// experts chosen by repeated argmax with ties to the lower index (= stable sort / the reference's
// comparator), weight sum accumulated in selection order.
#include <cmath>

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroups = 64;

// Warp-wide argmax of (value, index) with ties to the lower index; every lane gets the result.
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__global__ void __launch_bounds__(kWarps * 32)
    moe_router_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int32_t* __restrict__ ids,
                      float* __restrict__ weights, int64_t n_tokens, RouterParams p) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = p.n_experts;
  float* s = smem + warp * (2 * E + kMaxGroups);  // [E] sigmoid scores
  float* sc = s + E;                              // [E] selection scores (NaN once taken)
  float* gs = sc + E;                             // [n_group] group scores
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (t >= n_tokens) return;
  const float* l = logits + t * E;
  for (int e = lane; e < E; e += 32) {
    const float v = 1.0f / (1.0f + expf(-l[e]));
    s[e] = v;
    sc[e] = v + (bias ? bias[e] : 0.f);
  }
  __syncwarp();
  if (p.n_group > 1) {
    const int per_group = E / p.n_group;
    for (int g = lane; g < p.n_group; g += 32) {
      float a = -INFINITY, b = -INFINITY;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        if (sc[e] > a) {
          b = a;
          a = sc[e];
        } else if (sc[e] > b) {
          b = sc[e];
        }
      }
      gs[g] = a + b;
    }
    __syncwarp();
    unsigned long long kept = 0;  // bit g: group g kept
    for (int r = 0; r < p.topk_group; ++r) {
      float bv = -INFINITY;
      int bi = 0x7fffffff;
      for (int g = lane; g < p.n_group; g += 32)
        if (!((kept >> g) & 1ull) && better(gs[g], g, bv, bi)) {
          bv = gs[g];
          bi = g;
        }
      warp_argmax(bv, bi);
      kept |= 1ull << bi;
    }
    for (int e = lane; e < E; e += 32)
      if (!((kept >> (e / per_group)) & 1ull)) sc[e] = -INFINITY;
    __syncwarp();
  }
  float sum = 0.f;
  for (int k = 0; k < p.top_k; ++k) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32)
      if (!isnan(sc[e]) && better(sc[e], e, bv, bi)) {
        bv = sc[e];
        bi = e;
      }
    warp_argmax(bv, bi);
    __syncwarp();
    if (lane == 0) {
      ids[t * p.top_k + k] = bi;
      sum += s[bi];
      sc[bi] = NAN;  // taken
    }
    __syncwarp();
  }
  if (lane == 0) {
    const float denom = p.norm_topk_prob ? sum + 1e-20f : 1.0f;
    for (int k = 0; k < p.top_k; ++k) {
      const int e = ids[t * p.top_k + k];
      weights[t * p.top_k + k] = s[e] / denom * p.routed_scaling_factor;
    }
  }
}

}  // namespace

void moe_router(const float* logits, const float* bias, int32_t* topk_ids, float* topk_weights, int64_t n_tokens,
                const RouterParams& p, cudaStream_t stream) {
  if (n_tokens == 0) return;
  MX_CHECK_MSG(p.n_experts > 0 && p.n_experts <= 1024 && p.top_k >= 1 && p.top_k <= p.n_experts,
               "moe_router: n_experts " << p.n_experts << ", top_k " << p.top_k);
  MX_CHECK_MSG(p.n_group >= 1 && p.n_group <= kMaxGroups && p.n_experts % p.n_group == 0 &&
                   p.topk_group >= 1 && p.topk_group <= p.n_group,
               "moe_router: n_group " << p.n_group << ", topk_group " << p.topk_group);
  const size_t smem = static_cast<size_t>(kWarps) * (2 * p.n_experts + kMaxGroups) * sizeof(float);
  moe_router_kernel<<<ceil_div(n_tokens, kWarps), kWarps * 32, smem, stream>>>(logits, bias, topk_ids,
                                                                               topk_weights, n_tokens, p);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
