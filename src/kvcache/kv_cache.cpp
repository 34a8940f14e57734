#include "kvcache/kv_cache.h"

#include <string>

#include "core/check.h"

namespace mxserve::kvcache {

const char* cache_role_name(CacheRole r) {
  switch (r) {
    case CacheRole::kKey: return "key";
    case CacheRole::kValue: return "value";
    case CacheRole::kLatent: return "latent";
    case CacheRole::kIndexerKey: return "indexer_key";
  }
  return "?";
}

const char* kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kAuto: return "auto";
    case KvCacheDtype::kFp8E4M3: return "fp8_e4m3";
  }
  return "?";
}

Result<KvCacheDtype> parse_kv_cache_dtype(std::string_view text) {
  if (text == "auto" || text == "bf16") return KvCacheDtype::kAuto;
  if (text == "fp8_e4m3" || text == "fp8") return KvCacheDtype::kFp8E4M3;
  return invalid_argument("--kv-cache-dtype '" + std::string(text) + "': expected auto, bf16, fp8_e4m3 or fp8");
}

uint64_t CacheTensorSpec::bytes_per_slot() const {
  uint64_t b = dtype_bytes(dtype, static_cast<uint64_t>(width)).value_or(0);
  if (scale_width > 0) b += dtype_bytes(scale_dtype, static_cast<uint64_t>(scale_width)).value_or(0);
  return b;
}

const CacheTensorSpec* CacheLayerSpec::find(CacheRole r) const {
  for (const auto& t : tensors)
    if (t.role == r) return &t;
  return nullptr;
}

uint64_t KvCacheSpec::bytes_per_block() const {
  uint64_t per_slot = 0;
  for (const auto& layer : layers)
    for (const auto& t : layer.tensors) per_slot += t.bytes_per_slot();
  return per_slot * static_cast<uint64_t>(block_size);
}

KvCacheSpec KvCacheSpec::gqa(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                             int64_t head_dim, DType dtype) {
  KvCacheSpec s;
  s.n_blocks = n_blocks;
  s.block_size = block_size;
  CacheLayerSpec layer;
  layer.tensors = {{CacheRole::kKey, n_kv_heads * head_dim, dtype}, {CacheRole::kValue, n_kv_heads * head_dim, dtype}};
  s.layers.assign(static_cast<size_t>(n_layers), layer);
  return s;
}

KvCacheSpec KvCacheSpec::gqa_fp8(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                                 int64_t head_dim) {
  KvCacheSpec s = gqa(n_layers, n_blocks, block_size, n_kv_heads, head_dim, DType::kFP8E4M3);
  for (auto& layer : s.layers)
    for (auto& t : layer.tensors) {
      t.scale_width = n_kv_heads;
      t.scale_dtype = DType::kF32;
    }
  return s;
}

KvCache::KvCache(const KvCacheSpec& spec, const Allocator& alloc) : spec_(spec) {
  for (const auto& ls : spec.layers) {
    Layer layer;
    for (const auto& t : ls.tensors) {
      layer.data.push_back(alloc(t.dtype, {spec.n_slots(), t.width}));
      layer.scales.push_back(t.scale_width > 0 ? alloc(t.scale_dtype, {spec.n_slots(), t.scale_width}) : Tensor());
    }
    layers_.push_back(std::move(layer));
  }
}

Tensor& KvCache::tensor(int64_t layer, CacheRole role) {
  MX_CHECK_MSG(layer >= 0 && layer < spec_.n_layers(), "KV cache: layer " << layer << " of " << spec_.n_layers());
  const auto& ts = spec_.layers[layer].tensors;
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].role == role) return layers_[layer].data[i];
  MX_CHECK_MSG(false, "KV cache: layer " << layer << " has no " << cache_role_name(role) << " tensor in its layout");
  return layers_[layer].data.front();
}

Tensor& KvCache::scales(int64_t layer, CacheRole role) {
  MX_CHECK_MSG(layer >= 0 && layer < spec_.n_layers(), "KV cache: layer " << layer << " of " << spec_.n_layers());
  const auto& ts = spec_.layers[layer].tensors;
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].role == role && ts[i].scale_width > 0) return layers_[layer].scales[i];
  MX_CHECK_MSG(false, "KV cache: layer " << layer << " has no scales for " << cache_role_name(role));
  return layers_[layer].data.front();
}

Tensor* KvCache::scales_if_any(int64_t layer, CacheRole role) {
  MX_CHECK_MSG(layer >= 0 && layer < spec_.n_layers(), "KV cache: layer " << layer << " of " << spec_.n_layers());
  const auto& ts = spec_.layers[layer].tensors;
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].role == role && ts[i].scale_width > 0) return &layers_[layer].scales[i];
  return nullptr;
}

std::vector<Tensor*> KvCache::all_tensors() {
  std::vector<Tensor*> out;
  for (auto& layer : layers_) {
    for (auto& t : layer.data) out.push_back(&t);
    for (auto& t : layer.scales)
      if (t.ndim() == 2) out.push_back(&t);
  }
  return out;
}

void KvCache::enable_block_tables(int64_t max_rows, int64_t max_blocks_per_seq, const Allocator& alloc,
                                  BlockTableStore::Writer write) {
  block_tables_ = std::make_unique<BlockTableStore>(max_rows, max_blocks_per_seq, spec_.n_blocks, alloc,
                                                    std::move(write));
}

}  // namespace mxserve::kvcache
