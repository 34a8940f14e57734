// Paged KV cache storage, laid out as the model declares it. Per cached layer (target layers + the MTP
// layer) a list of cache tensors, each [n_blocks * block_size, width] with one row per token slot:
//   GQA            -- kKey + kValue, width n_kv_heads * head_dim each
//   MLA            -- one kLatent, width kv_lora_rank + qk_rope_head_dim (no separate V)
//   DSA (sparse)   -- kLatent + kIndexerKey (index_head_dim), the indexer keys possibly FP8 with per-slot scales
// The slot of KV index j of a sequence is block_table[j / block_size] * block_size + j % block_size in every
// tensor, so block accounting, prefix sharing and preemption (which move blocks, not bytes) never look
// inside a layout; copies of slots (tree compaction) go over every tensor of every layer.
// Owns: the tensors and their layout, and (when enabled) the device copy of the live sequences' block
// tables (BlockTableStore). Does not own: which blocks are free (BlockPool), the host block tables
// (sequences), prefix sharing (RadixCache) or any math.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kvcache/block_table_store.h"

namespace mxserve::kvcache {

class LayerLoadGate;  // kvcache/layer_load_gate.h

enum class CacheRole { kKey, kValue, kLatent, kIndexerKey };
const char* cache_role_name(CacheRole r);

// Element type of the K/V cache (--kv-cache-dtype, vLLM's names). kAuto: the backend's activation dtype
// (bf16 on CUDA, f32 on the CPU reference). kFp8E4M3: e4m3 codes + one f32 scale per (slot, kv head),
// quantized at write time (kernels/kv_fp8.h; docs/kv-cache.md says why dynamic scales).
enum class KvCacheDtype { kAuto, kFp8E4M3 };
const char* kv_cache_dtype_name(KvCacheDtype d);  // "auto" | "fp8_e4m3"
// "auto" and "bf16" -> kAuto; "fp8_e4m3" and "fp8" -> kFp8E4M3; anything else is an error naming it.
Result<KvCacheDtype> parse_kv_cache_dtype(std::string_view text);

// One cache tensor of a layer: `width` elements of `dtype` per token slot, plus (scale_width > 0) a scale
// tensor [n_slots, scale_width] of scale_dtype (e.g. FP8 keys with one f32 scale per slot or per head).
struct CacheTensorSpec {
  CacheRole role = CacheRole::kKey;
  int64_t width = 0;
  DType dtype = DType::kF32;
  int64_t scale_width = 0;
  DType scale_dtype = DType::kF32;
  uint64_t bytes_per_slot() const;
};

struct CacheLayerSpec {
  std::vector<CacheTensorSpec> tensors;
  const CacheTensorSpec* find(CacheRole r) const;
};

struct KvCacheSpec {
  int64_t n_blocks = 0;
  int64_t block_size = 16;
  std::vector<CacheLayerSpec> layers;  // cached layers in model order (the MTP layer last)

  int64_t n_layers() const { return static_cast<int64_t>(layers.size()); }
  int64_t n_slots() const { return n_blocks * block_size; }
  uint64_t bytes_per_block() const;  // every tensor (and scale) of every layer, one block of slots
  uint64_t bytes() const { return bytes_per_block() * static_cast<uint64_t>(n_blocks); }

  // GQA: n_layers layers of K and V, each [n_slots, n_kv_heads * head_dim] in dtype.
  static KvCacheSpec gqa(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                         int64_t head_dim, DType dtype);
  // GQA with an FP8 E4M3 cache: K and V u8 codes [n_slots, n_kv_heads * head_dim], each with f32 scales
  // [n_slots, n_kv_heads] (4 bytes per head_dim codes).
  static KvCacheSpec gqa_fp8(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                             int64_t head_dim);
};

class KvCache {
 public:
  using Allocator = std::function<Tensor(DType, Shape)>;
  KvCache(const KvCacheSpec& spec, const Allocator& alloc);
  const KvCacheSpec& spec() const { return spec_; }
  // The cache tensor of `role` in `layer` (CHECKs that the layout has it).
  Tensor& tensor(int64_t layer, CacheRole role);
  // Its scale tensor [n_slots, scale_width] (CHECKs that the layout declares one).
  Tensor& scales(int64_t layer, CacheRole role);
  // The scale tensor when the layout declares one, else nullptr.
  Tensor* scales_if_any(int64_t layer, CacheRole role);
  Tensor& k(int64_t layer) { return tensor(layer, CacheRole::kKey); }
  Tensor& v(int64_t layer) { return tensor(layer, CacheRole::kValue); }
  // Every tensor of the cache (data and scales, all layers): what a slot copy must move.
  std::vector<Tensor*> all_tensors();
  // The persistent device block tables (engine batches index rows of it); nullptr until enabled.
  void enable_block_tables(int64_t max_rows, int64_t max_blocks_per_seq, const Allocator& alloc,
                           BlockTableStore::Writer write);
  BlockTableStore* block_tables() { return block_tables_.get(); }
  // Host-tier blocks still being copied in (kvcache/layer_load_gate.h): a forward waits on the gate per cached
  // layer before reading it. nullptr (the default): nothing pending. Set and cleared by the executor.
  void set_load_gate(LayerLoadGate* gate) { load_gate_ = gate; }
  LayerLoadGate* load_gate() const { return load_gate_; }
  // The blocks the scheduler's BlockPool hands out: [0, pool_blocks()). The engine's cache holds one more, a
  // scratch block for padded graph rows (runtime/model_executor.cpp), which is no DP rank's: the DP ranges
  // (BlockPool::range_begin) are over pool_blocks(), never over spec().n_blocks. Default: every block.
  int64_t pool_blocks() const { return pool_blocks_ > 0 ? pool_blocks_ : spec_.n_blocks; }
  void set_pool_blocks(int64_t n) { pool_blocks_ = n; }

 private:
  struct Layer {
    std::vector<Tensor> data;    // one per spec tensor, in layout order
    std::vector<Tensor> scales;  // same index; empty tensor when the spec has no scales
  };
  KvCacheSpec spec_;
  std::vector<Layer> layers_;
  std::unique_ptr<BlockTableStore> block_tables_;
  LayerLoadGate* load_gate_ = nullptr;
  int64_t pool_blocks_ = 0;
};

}  // namespace mxserve::kvcache
