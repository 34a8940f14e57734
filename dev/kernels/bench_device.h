// What the MLA / DSA kernel benchmarks share (bench_mla_decode, bench_mla_fp8, bench_dsa_indexer): device buffers
// (leaked on purpose: each benchmark is one short process), bf16 comparison, and a paged decode batch of B
// sequences of ctx tokens each over a shuffled block table.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"

namespace bench {

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

}  // namespace bench
