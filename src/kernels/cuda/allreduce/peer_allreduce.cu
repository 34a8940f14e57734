// The fused peer all-reduce + residual add + RMSNorm kernels (see peer_allreduce.h for the math and the
// synchronization protocol). One kernel per algorithm and vector width: 8 bf16 per 16-byte access when
// cols % 8 == 0, else one element at a time (odd hidden sizes).
#include "kernels/cuda/allreduce/peer_allreduce.h"

#include <cuda_bf16.h>

namespace mxserve::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr unsigned long long kBarrierTimeoutNs = 10ull * 1000 * 1000 * 1000;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// V bf16 at p as floats; peer memory is read around L1 (.cg), since it changes between barriers.
template <int V>
__device__ __forceinline__ void load(const bf16* p, float (&f)[V]) {
  if constexpr (V == 8) {
    const uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 t = __bfloat1622float2(h[j]);
      f[2 * j] = t.x;
      f[2 * j + 1] = t.y;
    }
  } else {
    f[0] = __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p))));
  }
}
template <int V>
__device__ __forceinline__ void store(bf16* p, const float (&f)[V]) {
  if constexpr (V == 8) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
    *reinterpret_cast<uint4*>(p) = u;
  } else {
    p[0] = __float2bfloat16_rn(f[0]);
  }
}

__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[kThreads / 32];
  __shared__ float total;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) s += part[w];
    total = s;
  }
  __syncthreads();
  return total;
}

struct Ctx {
  PeerAllReduceArgs a;
  __device__ const bf16* input(int r) const { return static_cast<const bf16*>(a.buffers[r]); }
  __device__ bf16* result(int r) const {
    return reinterpret_cast<bf16*>(static_cast<char*>(a.buffers[r]) + a.capacity_bytes);
  }
  __device__ bf16* residual() const { return static_cast<bf16*>(a.residual); }
};

// Block b meets block b of every rank: its writes so far become visible to them, and theirs to it.
__device__ void peer_barrier(const PeerAllReduceArgs& a, uint32_t epoch) {
  __threadfence_system();
  __syncthreads();
  const int p = threadIdx.x;
  if (p < a.world) {
    store_release_sys(a.flags[p] + blockIdx.x * kPeerMaxRanks + a.rank, epoch);
    const uint32_t* mine = a.flags[a.rank] + blockIdx.x * kPeerMaxRanks + p;
    const unsigned long long start = global_ns();
    while (static_cast<int32_t>(load_acquire_sys(mine) - epoch) < 0) {
      if (*reinterpret_cast<volatile int*>(a.error) != 0) break;
      if (global_ns() - start > kBarrierTimeoutNs) {
        atomicExch(a.error, 1);
        break;
      }
    }
  }
  __syncthreads();
}

template <int V>
__device__ void copy_row(const bf16* src, bf16* dst, int64_t cols) {
  for (int64_t c = threadIdx.x * V; c < cols; c += kThreads * V) {
    float f[V];
    load<V>(src + c, f);
    store<V>(dst + c, f);
  }
}

// dst row = bf16(residual row + sum over ranks of their input rows); returns this thread's share of the
// sum of squares of the rounded values.
template <int V>
__device__ float reduce_row(const Ctx& ctx, int64_t row, bf16* dst, bool from_x) {
  const int64_t off = row * ctx.a.cols;
  float ss = 0.f;
  for (int64_t c = threadIdx.x * V; c < ctx.a.cols; c += kThreads * V) {
    float acc[V], t[V], r[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    for (int p = 0; p < (from_x ? 1 : ctx.a.world); ++p) {
      load<V>((from_x ? static_cast<const bf16*>(ctx.a.x) : ctx.input(p)) + off + c, t);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += t[j];
    }
    load<V>(ctx.residual() + off + c, r);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      r[j] = __bfloat162float(__float2bfloat16_rn(r[j] + acc[j]));
      ss += r[j] * r[j];
    }
    store<V>(dst + off + c, r);
  }
  return ss;
}

// out row = w * (residual row * inv_rms), the residual row already final on this rank.
template <int V>
__device__ void norm_row(const Ctx& ctx, int64_t row, float ss) {
  const float total = block_sum(ss);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(ctx.a.cols) + ctx.a.eps);
  const int64_t off = row * ctx.a.cols;
  bf16* out = static_cast<bf16*>(ctx.a.out);
  const bf16* w = static_cast<const bf16*>(ctx.a.weight);
  for (int64_t c = threadIdx.x * V; c < ctx.a.cols; c += kThreads * V) {
    float v[V], wv[V], o[V];
    load<V>(ctx.residual() + off + c, v);
    load<V>(w + c, wv);
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = wv[j] * (v[j] * inv);
    store<V>(out + off + c, o);
  }
}

template <int V>
__global__ void __launch_bounds__(kThreads) local_kernel(PeerAllReduceArgs a) {
  Ctx ctx{a};
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const float ss = reduce_row<V>(ctx, row, ctx.residual(), /*from_x=*/true);
    norm_row<V>(ctx, row, ss);
  }
}

template <int V>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(PeerAllReduceArgs a) {
  Ctx ctx{a};
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = a.counters[blockIdx.x];
  __syncthreads();
  const int64_t cols = a.cols;
  bf16* mine = const_cast<bf16*>(ctx.input(a.rank));
  if (a.x != mine)
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x)
      copy_row<V>(static_cast<const bf16*>(a.x) + row * cols, mine + row * cols, cols);
  peer_barrier(a, epoch + 1);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const float ss = reduce_row<V>(ctx, row, ctx.residual(), false);
    norm_row<V>(ctx, row, ss);
  }
  peer_barrier(a, epoch + 2);  // no rank refills its buffer (next call) before every peer has read it
  if (threadIdx.x == 0) a.counters[blockIdx.x] = epoch + 2;
}

// Every rank's x in one memory (buffers[r] = rank r's x), ordered by the caller's stream events: the one-shot
// reduction without the staging copy and the barriers (the same per-row math, so the same bits).
template <int V>
__global__ void __launch_bounds__(kThreads) direct_kernel(PeerAllReduceArgs a) {
  Ctx ctx{a};
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const float ss = reduce_row<V>(ctx, row, ctx.residual(), false);
    norm_row<V>(ctx, row, ss);
  }
}

// Rows split into world slices of S rows; rank r reduces slice r. Row i belongs to block (i % S) % B in
// every phase.
template <int V>
__global__ void __launch_bounds__(kThreads) two_shot_kernel(PeerAllReduceArgs a) {
  Ctx ctx{a};
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = a.counters[blockIdx.x];
  __syncthreads();
  const int64_t cols = a.cols, S = (a.rows + a.world - 1) / a.world;
  bf16* mine = const_cast<bf16*>(ctx.input(a.rank));
  if (a.x != mine)
    for (int o = 0; o < a.world; ++o)
      for (int64_t j = blockIdx.x; j < S && o * S + j < a.rows; j += gridDim.x) {
        const int64_t row = o * S + j;
        copy_row<V>(static_cast<const bf16*>(a.x) + row * cols, mine + row * cols, cols);
      }
  peer_barrier(a, epoch + 1);
  for (int64_t j = blockIdx.x; j < S && a.rank * S + j < a.rows; j += gridDim.x)
    reduce_row<V>(ctx, a.rank * S + j, ctx.result(a.rank), false);
  peer_barrier(a, epoch + 2);
  for (int o = 0; o < a.world; ++o)
    for (int64_t j = blockIdx.x; j < S && o * S + j < a.rows; j += gridDim.x) {
      const int64_t row = o * S + j;
      float ss = 0.f;
      for (int64_t c = threadIdx.x * V; c < cols; c += kThreads * V) {
        float v[V];
        load<V>(ctx.result(o) + row * cols + c, v);
#pragma unroll
        for (int k = 0; k < V; ++k) ss += v[k] * v[k];
        store<V>(ctx.residual() + row * cols + c, v);
      }
      norm_row<V>(ctx, row, ss);
    }
  peer_barrier(a, epoch + 3);
  if (threadIdx.x == 0) a.counters[blockIdx.x] = epoch + 3;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

const char* peer_algo_name(PeerAlgo a) {
  switch (a) {
    case PeerAlgo::kLocal: return "local";
    case PeerAlgo::kOneShot: return "one-shot";
    case PeerAlgo::kTwoShot: return "two-shot";
    case PeerAlgo::kDirect: return "direct";
  }
  return "?";
}

cudaError_t launch_peer_allreduce_rmsnorm(const PeerAllReduceArgs& a, PeerAlgo algo, int blocks, cudaStream_t stream) {
  if (a.rows <= 0 || a.cols <= 0) return cudaSuccess;
  if (blocks < 1 || blocks > kPeerMaxBlocks || a.world < 1 || a.world > kPeerMaxRanks) return cudaErrorInvalidValue;
  bool vec = a.cols % 8 == 0 && aligned16(a.x) && aligned16(a.residual) && aligned16(a.weight) && aligned16(a.out);
  for (int r = 0; r < a.world && algo != PeerAlgo::kLocal; ++r) vec = vec && aligned16(a.buffers[r]);
  vec = vec && a.capacity_bytes % 16 == 0;
  const dim3 grid(blocks), block(kThreads);
  switch (algo) {
    case PeerAlgo::kLocal:
      if (vec) local_kernel<8><<<grid, block, 0, stream>>>(a);
      else local_kernel<1><<<grid, block, 0, stream>>>(a);
      break;
    case PeerAlgo::kOneShot:
      if (vec) one_shot_kernel<8><<<grid, block, 0, stream>>>(a);
      else one_shot_kernel<1><<<grid, block, 0, stream>>>(a);
      break;
    case PeerAlgo::kTwoShot:
      if (vec) two_shot_kernel<8><<<grid, block, 0, stream>>>(a);
      else two_shot_kernel<1><<<grid, block, 0, stream>>>(a);
      break;
    case PeerAlgo::kDirect:
      if (vec) direct_kernel<8><<<grid, block, 0, stream>>>(a);
      else direct_kernel<1><<<grid, block, 0, stream>>>(a);
      break;
  }
  return cudaGetLastError();
}

}  // namespace mxserve::kernels::cuda
