// Device helpers shared by the DSA indexer and MLA attention kernels: which KV indices a token sees
// (causal bound, optional speculative-tree mask) and where KV index j of a sequence lives in the paged
// cache. The same rule as the CPU reference (kernels/cpu/mla_dsa.cpp), so a sparse set never widens the
// causal one.
#pragma once

#include <cstdint>

#include "kernels/op_params.h"

namespace mxserve::kernels::cuda {

struct MlaVisibility {
  int64_t n_ctx;      // kv_index[t] + 1
  int64_t tree_base;  // n_ctx when the row has no tree mask
  uint64_t tree_mask;
  __device__ __forceinline__ bool operator()(int64_t j) const {
    return j >= 0 && j < n_ctx && (j < tree_base || ((tree_mask >> (j - tree_base)) & 1u) != 0);
  }
};

__device__ __forceinline__ MlaVisibility mla_visibility(const int32_t* kv_index, const AttentionParams& ap,
                                                        int64_t t) {
  const int64_t n_ctx = static_cast<int64_t>(kv_index[t]) + 1;
  if (ap.tree_mask == nullptr) return {n_ctx, n_ctx, 0};
  return {n_ctx, static_cast<int64_t>(ap.tree_base[t]), ap.tree_mask[t]};
}

// Cache slot of KV index j of the sequence whose block-table row is `table`.
__device__ __forceinline__ int64_t mla_slot(const int32_t* table, int64_t j, int block_size) {
  return static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
}

}  // namespace mxserve::kernels::cuda
