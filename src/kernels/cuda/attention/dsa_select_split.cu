// The cluster-split top-k select of the fused DSA indexer (IndexerScoreKernel::kFusedSplit): the exact top-k
// of a token's order codes (dsa_indexer_fused.cu writes them with the first-digit histogram) found by a
// thread-block cluster of 1..8 CTAs per token instead of one block, so a batch-1 decode uses 8 SMs for the
// select and each CTA reads an eighth of the row. CTA `rank` owns keys dsa::split_range(n, ctas, rank):
//  - digit 0 (bits [31:20]): counted like the digits below (kDsaSplitOwnHist: the score kernel then builds no
//    histogram and no memset runs), else every CTA reads the token's histogram (the score kernel's); either way
//    every CTA finds the same threshold digit, so the whole cluster takes the same branches;
//  - digits 1 (bits [19:8]) and 2 (bits [7:0]) (and 0, above): each CTA counts the digit of its range's
//    candidates in its own shared histogram and adds the non-zero bins into rank 0's merge histogram through
//    distributed shared memory; after a cluster barrier every CTA runs the bin search on rank 0's histogram
//    (the sum over the cluster = the one-block pass over the row);
//  - the ordered write: each CTA counts its keys above / tied with the threshold, publishes the pair in rank 0's
//    shared memory, and writes its kept keys from (above in lower ranks) + min(ties in lower ranks, thr.ties).
// Tie rule (the CPU oracle's, kernels/dsa_topk_radix.h): every code above the threshold is kept and, of the
// codes equal to it, the thr.ties with the lowest KV indices; the output is ascending, -1 padded. The host
// emulation dsa::select_split_host runs the same ranges and counts (tests/unit/kernels/test_dsa_topk_radix.cpp).
// Rows whose context is <= top_k keep every visible key (the score kernel skipped them). No allocation, no host
// sync: the launch can be captured in a CUDA graph. Needs sm_90 (clusters). With kDsaSplitPdl the launch is a
// programmatic dependent of the score kernel (which signals at its start): the clusters are scheduled while the
// score kernel's last blocks run and wait (griddepcontrol.wait) for its completion before reading anything.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/attention/dsa_indexer_fused.h"
#include "kernels/cuda/attention/dsa_select_block.cuh"
#include "kernels/cuda/attention/mla_visibility.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/dsa_topk_radix.h"

namespace mxserve::kernels::cuda {
namespace {

namespace cg = cooperative_groups;
namespace dsa = kernels::dsa;

constexpr int kSplitThreads = 1024;  // threads of each CTA of a cluster
constexpr int kPerThread = 8;        // consecutive keys a thread owns in a step of the ordered write
// Dynamic shared memory: this CTA's histogram, then rank 0's merge targets of digits 0, 1 (4096 bins) and 2 (256).
constexpr size_t kSplitSmemBytes = (3 * dsa::kHistBins + 256) * sizeof(uint32_t);

// hist[digit `pass` of c] += 1 for the visible codes c of row[lo, hi) whose bits above the digit equal prefix's.
__device__ __forceinline__ void count_digit(const uint32_t* __restrict__ row, dsa::SplitRange range, int pass,
                                            uint32_t prefix, uint32_t* hist) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint32_t mask = dsa::prefix_mask(pass);
  for (int64_t base = range.lo; base < range.hi; base += kPerThread * static_cast<int64_t>(nt)) {
    uint32_t c[kPerThread];
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int64_t j = base + u * nt + tid;
      c[u] = j < range.hi ? row[j] : 0u;
    }
#pragma unroll
    for (int u = 0; u < kPerThread; ++u)
      if (c[u] != 0 && (c[u] & mask) == prefix) atomicAdd(&hist[dsa::digit_of(c[u], pass)], 1u);
  }
}

// Adds this CTA's non-zero bins into rank 0's merge target (distributed shared memory).
__device__ __forceinline__ void push_bins(const uint32_t* hist, uint32_t* merged_0, int bins) {
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (hist[b] != 0) atomicAdd(&merged_0[b], hist[b]);
}

// Grid (ctas, group tokens), cluster (ctas, 1, 1): cluster y selects token t0 + y.
__global__ void __launch_bounds__(kSplitThreads) dsa_select_split_kernel(
    const uint32_t* __restrict__ codes, const uint32_t* __restrict__ hist_g, int64_t stride, int64_t t0,
    const int32_t* __restrict__ kv_index, AttentionParams ap, int32_t* __restrict__ topk, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) uint32_t split_smem[];
  uint32_t* hist = split_smem;                         // this CTA's counts of the current digit
  uint32_t* merged0 = split_smem + dsa::kHistBins;     // rank 0's: the cluster's digit-0 counts (own-hist mode)
  uint32_t* merged1 = split_smem + 2 * dsa::kHistBins; // rank 0's: the cluster's digit-1 counts
  uint32_t* merged2 = split_smem + 3 * dsa::kHistBins; // rank 0's: the cluster's digit-2 counts (256)
  __shared__ unsigned long long counts[kDsaSplitMaxCtas];  // rank 0's: (above << 32) | ties per rank
  __shared__ uint32_t warp_u32[32], total_u32;
  __shared__ unsigned long long warp_u64[32], total_u64, base_s, all_s;
  __shared__ dsa::RadixStep step_s;
  const int rank = static_cast<int>(cluster.block_rank()), ctas = static_cast<int>(cluster.num_blocks());
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t tl = blockIdx.y, t = t0 + tl;
  const MlaVisibility vis = mla_visibility(kv_index, ap, t);
  const int64_t n = vis.n_ctx < stride ? vis.n_ctx : stride;
  const dsa::SplitRange range = dsa::split_range(n, ctas, rank);
  const uint32_t* row = codes + tl * stride;
  const bool skip = n <= K;  // every visible key is selected (the score kernel skipped this row)
  for (int b = tid; b < 2 * dsa::kHistBins + 256; b += nt) merged0[b] = 0;  // merged0, merged1, merged2
  // Launched with programmatic dependent launch (kDsaSplitPdl): the score kernel may still run until here; this
  // waits for its completion and its writes (a no-op when launched without the attribute).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  cluster.sync();  // every CTA runs and rank 0's merge targets are zero before any rank adds into them
  uint32_t* merged0_0 = cluster.map_shared_rank(merged0, 0);
  uint32_t* merged1_0 = cluster.map_shared_rank(merged1, 0);
  uint32_t* merged2_0 = cluster.map_shared_rank(merged2, 0);
  unsigned long long* counts_0 = cluster.map_shared_rank(counts, 0);
  dsa::Threshold thr;  // code 0: keep every visible key
  if (!skip) {
    const uint32_t* hist0 = hist;  // the row's first-digit histogram
    if (hist_g != nullptr) {       // the score kernel's
      for (int b = tid; b < dsa::kHistBins; b += nt) hist[b] = hist_g[tl * dsa::kHistBins + b];
      __syncthreads();
    } else {  // counted here, as the other digits: this range's visible codes, summed in rank 0
      for (int b = tid; b < dsa::kHistBins; b += nt) hist[b] = 0;
      __syncthreads();
      count_digit(row, range, 0, 0u, hist);
      __syncthreads();
      push_bins(hist, merged0_0, dsa::kHistBins);
      cluster.sync();
      hist0 = merged0_0;
    }
    dsa::RadixStep s = block_radix_step(hist0, dsa::kHistBins, static_cast<uint32_t>(K), warp_u32, &total_u32, &step_s);
    if (total_u32 > static_cast<uint32_t>(K)) {  // uniform over the cluster: every rank read the same histogram
      thr.code = s.digit << dsa::digit_shift(0);
      thr.ties = s.k_rem;
      for (int pass = 1; pass < 3; ++pass) {
        const int bins = dsa::digit_bins(pass);
        for (int b = tid; b < bins; b += nt) hist[b] = 0;
        __syncthreads();
        count_digit(row, range, pass, thr.code & dsa::prefix_mask(pass), hist);
        __syncthreads();
        uint32_t* merged_0 = pass == 1 ? merged1_0 : merged2_0;
        push_bins(hist, merged_0, bins);
        cluster.sync();
        s = block_radix_step(merged_0, bins, thr.ties, warp_u32, &total_u32, &step_s);
        thr.code |= s.digit << dsa::digit_shift(pass);
        thr.ties = s.k_rem;
      }
    }
  }
  // This range's keys above / tied with the threshold, published in rank 0's counts.
  unsigned long long mine = 0;
  for (int64_t j = range.lo + tid; j < range.hi; j += nt) {
    const uint32_t c = skip ? (vis(j) ? 1u : 0u) : row[j];  // skip: thr.code 0, every visible key is "above"
    mine += (static_cast<unsigned long long>(c > thr.code) << 32) | (thr.code != 0 && c == thr.code ? 1ull : 0ull);
  }
  block_inclusive_scan(mine, warp_u64, &total_u64);
  if (tid == 0) counts_0[rank] = total_u64;
  cluster.sync();
  if (tid == 0) {
    unsigned long long before = 0, all = 0;
    for (int r = 0; r < ctas; ++r) {
      const unsigned long long v = counts_0[r];
      before += r < rank ? v : 0ull;
      all += v;
    }
    base_s = before;
    all_s = all;
  }
  __syncthreads();
  cluster.barrier_arrive();  // rank 0's shared memory is no longer read by this CTA (waited on before exit)
  // Ordered write of this range in steps of kPerThread * nt keys, thread i owning keys [8 i, 8 i + 8) of a step.
  unsigned long long base_cnt = base_s;  // (above << 32) | ties before the step
  int32_t* out = topk + t * K;
  for (int64_t step = range.lo; step < range.hi; step += kPerThread * static_cast<int64_t>(nt)) {
    uint32_t c[kPerThread];
    unsigned long long own = 0;
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int64_t j = step + kPerThread * tid + u;
      if (skip) c[u] = j < range.hi && vis(j) ? 1u : 0u;
      else c[u] = j < range.hi ? row[j] : 0u;
      const bool above = c[u] > thr.code, tie = thr.code != 0 && c[u] == thr.code;
      own += (static_cast<unsigned long long>(above) << 32) | (tie ? 1ull : 0ull);
    }
    const unsigned long long incl = block_inclusive_scan(own, warp_u64, &total_u64);
    unsigned long long before = base_cnt + incl - own;
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const uint32_t above_before = static_cast<uint32_t>(before >> 32), ties_before = static_cast<uint32_t>(before);
      const bool above = c[u] > thr.code, tie = thr.code != 0 && c[u] == thr.code;
      if (above || (tie && ties_before < thr.ties)) {
        const uint32_t pos = above_before + min(ties_before, thr.ties);
        if (pos < static_cast<uint32_t>(K)) out[pos] = static_cast<int32_t>(step + kPerThread * tid + u);
      }
      before += (static_cast<unsigned long long>(above) << 32) | (tie ? 1ull : 0ull);
    }
    base_cnt += total_u64;
  }
  const unsigned long long all = all_s;
  const uint32_t written = static_cast<uint32_t>(all >> 32) + min(static_cast<uint32_t>(all), thr.ties);
  for (int64_t i = static_cast<int64_t>(written) + static_cast<int64_t>(rank) * nt + tid; i < K;
       i += static_cast<int64_t>(ctas) * nt)
    out[i] = -1;
  cluster.barrier_wait();  // no CTA leaves while another may still read rank 0's shared memory
#endif
}

// The largest cluster size in 1..ctas (powers of two) whose 1024-thread CTAs the device can co-schedule;
// queried once per (device, size).
int schedulable_ctas(int ctas) {
  static std::atomic<int> ok[64][kDsaSplitMaxCtas + 1];  // 0 unknown, 1 yes, 2 no
  static std::atomic<bool> smem_set[64];
  int dev = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  if (!smem_set[dev & 63].load()) {  // > 48 KiB of dynamic shared memory: opt in once per device
    MX_CUDA_CHECK(cudaFuncSetAttribute(dsa_select_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSplitSmemBytes)));
    smem_set[dev & 63].store(true);
  }
  for (; ctas > 1; ctas /= 2) {
    std::atomic<int>& known = ok[dev & 63][ctas];
    if (known.load() == 0) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(static_cast<unsigned>(ctas), 1, 1);
      cfg.blockDim = dim3(kSplitThreads, 1, 1);
      cfg.dynamicSmemBytes = kSplitSmemBytes;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = static_cast<unsigned>(ctas);
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, dsa_select_split_kernel, &cfg);
      if (e != cudaSuccess) (void)cudaGetLastError();
      known.store(e == cudaSuccess && clusters > 0 ? 1 : 2);
    }
    if (known.load() == 1) return ctas;
  }
  return 1;
}

}  // namespace

int dsa_select_split_ctas(int64_t group_tokens, int64_t max_ctx, int sm_count) {
  return dsa::split_ctas(group_tokens, max_ctx, sm_count, kDsaSplitMaxCtas);  // (tested on the host)
}

void dsa_select_split_launch(const uint32_t* codes, const uint32_t* hist, int64_t stride, int64_t t0, int64_t tg,
                             const int32_t* kv_index, const AttentionParams& ap, int32_t* topk, int K, int ctas,
                             cudaStream_t stream) {
  MX_CHECK_MSG(ctas >= 1 && ctas <= kDsaSplitMaxCtas && (ctas & (ctas - 1)) == 0,
               "dsa_select_split_launch: ctas " << ctas << " (a power of two in 1.." << kDsaSplitMaxCtas << ")");
  static std::atomic<int> major_of[64];  // compute capability major per device, 0 unknown
  int dev = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  if (major_of[dev & 63].load() == 0) {
    int major = 0;
    MX_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    major_of[dev & 63].store(major);
  }
  MX_CHECK_MSG(major_of[dev & 63].load() >= 9, "dsa_indexer_topk (IndexerScoreKernel::kFusedSplit): the cluster-split "
                                               "select needs an sm_90 device (thread-block clusters); device "
                                                   << dev << " is sm_" << major_of[dev & 63].load()
                                                   << "x: use kFused or kAuto");
  ctas = schedulable_ctas(ctas);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(tg), 1);
  cfg.blockDim = dim3(kSplitThreads, 1, 1);
  cfg.dynamicSmemBytes = kSplitSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(ctas);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  // PDL on explicit streams only (the legacy default stream's implicit synchronization is left plain).
  const bool pdl = kDsaSplitPdl && stream != nullptr && stream != cudaStreamLegacy;
  cfg.numAttrs = pdl ? 2 : 1;
  MX_CUDA_CHECK(cudaLaunchKernelEx(&cfg, dsa_select_split_kernel, codes, hist, stride, t0, kv_index, ap, topk, K));
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
