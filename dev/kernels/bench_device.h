// What the kernel benchmarks share (bench_mla_decode, bench_mla_fp8, bench_dsa_indexer, bench_mla_sparse_prefill,
// bench_moe_mxfp4_pd / _wg, bench_moe_prefill_dequant): the device check, the M list from the command line, device buffers (leaked on purpose: each benchmark is one short
// process), bf16 comparison, a paged decode batch of B sequences of ctx tokens each over a shuffled block table,
// and its attention geometry and random top-k lists (the MLA geometry: kernels/mla_geometry.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/op_params.h"

namespace bench {

// True when a CUDA device is present; else prints "SKIP: no CUDA device<note>" (a benchmark then exits 0).
inline bool cuda_device_present(const char* note = "") {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("SKIP: no CUDA device%s\n", note);
    return false;
  }
  return true;
}

// Token counts M from argv[1..] (each a positive integer), else `dflt`. False, after an error that names the
// program and the value, on any other argument.
inline bool token_counts_from_args(int argc, char** argv, const char* prog, const std::vector<int64_t>& dflt,
                                   std::vector<int64_t>* out) {
  out->clear();
  for (int i = 1; i < argc; ++i) {
    const long long m = std::atoll(argv[i]);
    if (m <= 0) {
      std::fprintf(stderr, "%s: M '%s' must be a positive token count\n", prog, argv[i]);
      return false;
    }
    out->push_back(m);
  }
  if (out->empty()) *out = dflt;
  return true;
}

template <typename T>
T* dev_alloc(size_t n) {
  void* p = nullptr;
  MX_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

template <typename T>
T* dev_upload(const std::vector<T>& v) {
  T* p = dev_alloc<T>(v.size());
  MX_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// rel L2 of a against b (bf16 bits, n values); +inf when either holds a NaN.
inline double rel_l2_bf16(const uint16_t* a, const uint16_t* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// B decode rows, one per sequence, each at context ctx: block tables [B, blocks_per_seq] (a shuffled permutation
// of the pool's blocks, so reads are not contiguous), token_seq[i] = i, kv_index[i] = ctx - 1.
struct PagedDecodeBatch {
  int64_t blocks_per_seq = 0, n_blocks = 0;
  std::vector<int32_t> block_tables, token_seq, kv_index;
};
inline PagedDecodeBatch paged_decode_batch(int B, int64_t ctx, int64_t block_size, std::mt19937& rng) {
  PagedDecodeBatch b;
  b.blocks_per_seq = (ctx + block_size - 1) / block_size;
  b.n_blocks = B * b.blocks_per_seq;
  b.block_tables.resize(static_cast<size_t>(b.n_blocks));
  std::iota(b.block_tables.begin(), b.block_tables.end(), 0);
  std::shuffle(b.block_tables.begin(), b.block_tables.end(), rng);
  b.token_seq.resize(B);
  std::iota(b.token_seq.begin(), b.token_seq.end(), 0);
  b.kv_index.assign(B, static_cast<int32_t>(ctx - 1));
  return b;
}

// The attention geometry of paged_decode_batch(B, ctx, block_size): B rows of B sequences, heads x head_dim.
inline mxserve::kernels::AttentionParams decode_attention_params(const PagedDecodeBatch& b, int B, int heads,
                                                                 int head_dim, int block_size, int64_t ctx) {
  mxserve::kernels::AttentionParams ap;
  ap.n_tokens = B;
  ap.n_seqs = B;
  ap.n_heads = heads;
  ap.n_kv_heads = 1;
  ap.head_dim = head_dim;
  ap.block_size = block_size;
  ap.max_blocks_per_seq = static_cast<int32_t>(b.blocks_per_seq);
  ap.max_kv_len = static_cast<int32_t>(ctx);
  return ap;
}

// B top-k lists [B, topk] over a context of ctx keys: each a random ascending subset of [0, ctx) (one shuffle of
// rng per row), -1 padded where ctx < topk.
inline std::vector<int32_t> random_topk_rows(int B, int64_t ctx, int topk, std::mt19937& rng) {
  std::vector<int32_t> rows, all(static_cast<size_t>(ctx));
  for (int b = 0; b < B; ++b) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> pick(all.begin(), all.begin() + std::min<int64_t>(topk, ctx));
    std::sort(pick.begin(), pick.end());
    pick.resize(topk, -1);
    rows.insert(rows.end(), pick.begin(), pick.end());
  }
  return rows;
}

}  // namespace bench
