// Paged KV cache storage and a block allocator. The cache is one K and one V tensor per attention
// layer (the MTP layer has its own), each [n_blocks * block_size, n_kv_heads * head_dim], so the slot
// of KV index j of a sequence is block_table[j / block_size] * block_size + j % block_size.
// Owns: the tensors. Does not own: which blocks are free (BlockPool), block tables (sequences),
// prefix sharing (RadixCache) or any math.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::kvcache {

struct KvCacheSpec {
  int64_t n_layers = 0;   // attention layers with a cache (target layers + MTP layer)
  int64_t n_blocks = 0;
  int64_t block_size = 16;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kF32;
  int64_t kv_width() const { return n_kv_heads * head_dim; }
  uint64_t bytes() const;  // K + V over all layers
};

class KvCache {
 public:
  using Allocator = std::function<Tensor(DType, Shape)>;
  KvCache(const KvCacheSpec& spec, const Allocator& alloc);
  const KvCacheSpec& spec() const { return spec_; }
  Tensor& k(int64_t layer) { return k_[layer]; }
  Tensor& v(int64_t layer) { return v_[layer]; }

 private:
  KvCacheSpec spec_;
  std::vector<Tensor> k_, v_;
};

}  // namespace mxserve::kvcache
