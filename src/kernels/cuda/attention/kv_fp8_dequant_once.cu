// FP8 prefill attention, dequantized once (issue 33, docs/perf/seed-workload.md "Session 16"): the wgmma_ws
// kernel's FP8 producer dequantizes every K / V tile once per q-head block that reads it -- 12 times per tile for
// GLM-4.5-Air (96 q heads over 8 KV heads) -- and runs at 0.64-0.75x the bf16 cache's speed. Here the step's
// prefill context is dequantized once into a bf16 scratch (two small kernels), then the bf16 wgmma_ws kernel runs
// over it through an identity page table.
//   index    one block: the part's rows form runs (one per sequence: the batch builder puts each sequence's rows
//            together, model/forward_batch.cpp); run r gets scratch blocks [r nb, (r + 1) nb), nb = the blocks
//            of the longest context (p.max_kv_len); each row's sequence index becomes its run; each run's key
//            count is the largest kv_index + 1 of its rows.
//   dequant  one block per (run, block < nb) inside the run's keys: codes * scale -> bf16 (fp8x16_to_bf16, the
//            wgmma_ws producer's conversion: the same bf16 values, bit for bit), 16 codes a thread-step.
// Workspace (fp8_dequant_once_workspace_bytes): the K and V scratch, [kFp8DequantOnceSlots][n_kv_heads * 128] bf16
// each -- a fixed size, so the start-up dry run's peak counts it as every later step's -- then the index arrays.
// Cost at the seed (20k context, 8 KV heads): ~41 MB read + ~82 MB written per layer, ~30 us against ~14 ms of
// attention. Rows past the runs the host counted (a batch breaking the one-run-per-sequence rule) get the
// sentinel table row (every entry -1: no keys, zero output) -- wrong but bounded; the batch builder never makes one.
#include <cuda_bf16.h>

#include "core/check.h"
#include "kernels/cuda/attention/kv_fp8_load.cuh"
#include "kernels/cuda/attention/paged_attention_wgmma.h"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kHeadDim = 128;
constexpr int kIndexThreads = 1024;
constexpr int kDequantThreads = 256;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Blocks per run: the longest context's.
int64_t blocks_per_run(const AttentionParams& p) {
  const int64_t keys = p.max_kv_len > 0 ? p.max_kv_len : static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  return (keys + p.block_size - 1) / p.block_size;
}

struct Layout {
  size_t k = 0, v = 0, new_seq = 0, run_row = 0, run_end = 0, tables = 0, total = 0;
};
// [K scratch | V scratch | new_seq i32 [n_tokens] | run_row i32 [ns] | run_end i32 [ns] | tables i32 [(ns+1) nb]]
Layout layout_of(const AttentionParams& p) {
  Layout l;
  const size_t scratch = static_cast<size_t>(kFp8DequantOnceSlots) * p.n_kv_heads * kHeadDim * sizeof(__nv_bfloat16);
  const int64_t ns = p.n_seqs, nb = blocks_per_run(p);
  l.k = 0;
  l.v = align_up(scratch);
  l.new_seq = l.v + align_up(scratch);
  l.run_row = l.new_seq + align_up(sizeof(int32_t) * p.n_tokens);
  l.run_end = l.run_row + align_up(sizeof(int32_t) * ns);
  l.tables = l.run_end + align_up(sizeof(int32_t) * ns);
  l.total = l.tables + align_up(sizeof(int32_t) * (ns + 1) * nb);
  return l;
}

// Inclusive sum of v over the block (kIndexThreads threads).
__device__ int block_inclusive_sum(int v, int* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  const int out = v + (warp > 0 ? warp_sums[warp - 1] : 0);
  __syncthreads();  // warp_sums is reused by the next call
  return out;
}

__global__ void __launch_bounds__(kIndexThreads)
    fp8_dequant_once_index_kernel(const int32_t* __restrict__ token_seq, const int32_t* __restrict__ kv_index,
                                  int n_tokens, int ns, int nb, int32_t* __restrict__ new_seq,
                                  int32_t* __restrict__ run_row, int32_t* __restrict__ run_end,
                                  int32_t* __restrict__ tables) {
  __shared__ int warp_sums[32];
  __shared__ int carry;  // run id of the previous chunk's last row
  const int tid = threadIdx.x;
  for (int64_t i = tid; i < static_cast<int64_t>(ns + 1) * nb; i += kIndexThreads)
    tables[i] = i < static_cast<int64_t>(ns) * nb ? static_cast<int32_t>(i) : -1;  // run r, block b -> r nb + b
  for (int i = tid; i < ns; i += kIndexThreads) run_end[i] = 0;
  if (tid == 0) carry = -1;
  __syncthreads();
  for (int base = 0; base < n_tokens; base += kIndexThreads) {
    const int t = base + tid;
    const bool in = t < n_tokens;
    const int seq = in ? token_seq[t] : 0;
    const bool starts = in && (t == 0 || token_seq[t - 1] != seq);
    const int run = carry + block_inclusive_sum(starts ? 1 : 0, warp_sums);
    if (in) {
      new_seq[t] = run < ns ? run : ns;  // ns: the sentinel row (no keys)
      if (run < ns) {
        if (starts) run_row[run] = seq;
        atomicMax(run_end + run, kv_index[t] + 1);
      }
    }
    __syncthreads();
    if (tid == kIndexThreads - 1) carry = run;
    __syncthreads();
  }
}

// One block per (block b, run r): the run's keys in block b, K and V, codes * scale -> bf16 into scratch block
// r nb + b. Rows are [n_kv_heads * 128] codes (bytes) in the cache, the same width of bf16 in the scratch.
__global__ void __launch_bounds__(kDequantThreads)
    fp8_dequant_once_kernel(const uint8_t* __restrict__ k_codes, const uint8_t* __restrict__ v_codes,
                            const float* __restrict__ k_scales, const float* __restrict__ v_scales,
                            const int32_t* __restrict__ block_tables, int max_blocks_per_seq, int block_size,
                            int n_kv_heads, int nb, const int32_t* __restrict__ run_row,
                            const int32_t* __restrict__ run_end, __nv_bfloat16* __restrict__ k_out,
                            __nv_bfloat16* __restrict__ v_out) {
  const int b = blockIdx.x, r = blockIdx.y;
  const int end = run_end[r];
  if (static_cast<int64_t>(b) * block_size >= end) return;  // past the run's keys (none of its rows reads them)
  const int64_t src_block = block_tables[static_cast<int64_t>(run_row[r]) * max_blocks_per_seq + b];
  const int64_t src0 = src_block * block_size, dst0 = (static_cast<int64_t>(r) * nb + b) * block_size;
  const int64_t width = static_cast<int64_t>(n_kv_heads) * kHeadDim;
  const int chunks = n_kv_heads * (kHeadDim / 16);  // 16-code chunks per row
  const int n = block_size * chunks;
  for (int i = threadIdx.x; i < 2 * n; i += kDequantThreads) {
    const bool is_v = i >= n;
    const int j = is_v ? i - n : i;
    const int row = j / chunks, c = j % chunks, head = c / (kHeadDim / 16);
    const int64_t src = src0 + row;
    const float scale = __ldg((is_v ? v_scales : k_scales) + src * n_kv_heads + head);
    const uint4 codes = __ldg(reinterpret_cast<const uint4*>((is_v ? v_codes : k_codes) + src * width + c * 16));
    uint4 lo, hi;
    fp8x16_to_bf16(codes, scale, lo, hi);
    uint4* dst = reinterpret_cast<uint4*>((is_v ? v_out : k_out) + (dst0 + row) * width + c * 16);
    dst[0] = lo;
    dst[1] = hi;
  }
}

}  // namespace

int64_t fp8_dequant_once_slots(const AttentionParams& p) {
  return static_cast<int64_t>(p.n_seqs) * blocks_per_run(p) * p.block_size;
}

size_t fp8_dequant_once_workspace_bytes(const AttentionParams& p) { return layout_of(p).total; }

void paged_attention_wgmma_ws_fp8_dequant_once(const void* q, const void* k_cache, const void* v_cache,
                                               const int32_t* token_seq, const int32_t* kv_index,
                                               const int32_t* block_tables, void* out, const AttentionParams& p,
                                               void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (p.n_tokens == 0) return;
  MX_CHECK_MSG(p.fp8_kv() && p.head_dim == kHeadDim && p.n_seqs > 0,
               "fp8 dequantize-once attention: an FP8 cache, head_dim 128 and n_seqs > 0 (planner bug)");
  MX_CHECK_MSG(fp8_dequant_once_slots(p) <= kFp8DequantOnceSlots,
               "fp8 dequantize-once attention: " << fp8_dequant_once_slots(p) << " context slots over the scratch's "
                                                 << kFp8DequantOnceSlots << " (planner bug)");
  const Layout l = layout_of(p);
  MX_CHECK_MSG(workspace != nullptr && workspace_bytes >= l.total,
               "fp8 dequantize-once attention: workspace " << workspace_bytes << " bytes, needs " << l.total);
  auto* ws = static_cast<unsigned char*>(workspace);
  auto* k_bf16 = reinterpret_cast<__nv_bfloat16*>(ws + l.k);
  auto* v_bf16 = reinterpret_cast<__nv_bfloat16*>(ws + l.v);
  auto* new_seq = reinterpret_cast<int32_t*>(ws + l.new_seq);
  auto* run_row = reinterpret_cast<int32_t*>(ws + l.run_row);
  auto* run_end = reinterpret_cast<int32_t*>(ws + l.run_end);
  auto* tables = reinterpret_cast<int32_t*>(ws + l.tables);
  const int ns = p.n_seqs, nb = static_cast<int>(blocks_per_run(p));
  fp8_dequant_once_index_kernel<<<1, kIndexThreads, 0, stream>>>(token_seq, kv_index, p.n_tokens, ns, nb, new_seq,
                                                                  run_row, run_end, tables);
  MX_CUDA_CHECK_LAUNCH();
  MX_CHECK_LT(nb, 1 << 30);
  fp8_dequant_once_kernel<<<dim3(static_cast<unsigned>(nb), static_cast<unsigned>(ns)), kDequantThreads, 0, stream>>>(
      static_cast<const uint8_t*>(k_cache), static_cast<const uint8_t*>(v_cache), p.k_scales, p.v_scales,
      block_tables, p.max_blocks_per_seq, p.block_size, p.n_kv_heads, nb, run_row, run_end, k_bf16, v_bf16);
  MX_CUDA_CHECK_LAUNCH();
  AttentionParams bf = p;
  bf.k_scales = bf.v_scales = nullptr;
  bf.max_blocks_per_seq = nb;
  paged_attention_wgmma_ws(q, k_bf16, v_bf16, new_seq, kv_index, tables, out, bf, stream);
}

}  // namespace mxserve::kernels::cuda
