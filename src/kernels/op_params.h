// Parameter structs shared by the CPU reference kernels and the CUDA kernels. Kernels see pointers,
// strides and these structs -- never a Request, a Sequence or the KV manager.
#pragma once

#include <cstdint>

namespace mxserve::kernels {

// Partial NeoX RoPE: rotate dims [0, rotary_dim) of each head as two halves; dims >= rotary_dim pass.
struct RopeParams {
  int32_t n_heads = 0;
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;
  float theta = 10000.f;
};

// Sigmoid router with DeepSeek-V3 style group-limited top-k ("noaux_tc").
struct RouterParams {
  int32_t n_experts = 0;
  int32_t top_k = 0;
  int32_t n_group = 1;
  int32_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.f;
};

// Paged attention over a batch of sequences. Token t of sequence s has KV index kv_index[t]
// (0-based in its sequence) and attends to KV indices [0, kv_index[t]] (causal).
struct AttentionParams {
  int32_t n_tokens = 0;
  int32_t n_seqs = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t max_blocks_per_seq = 0;  // row stride of block_tables
  int32_t max_kv_len = 0;          // bound on every kv_index + 1 (split plans); 0: max_blocks_per_seq * block_size
  float scale = 1.f;
  // Tree attention (speculative tree verification / drafting), on the kernel's device; both null for a
  // plain causal batch (zero cost). Token t attends to KV indices j <= kv_index[t] with
  // j < tree_base[t] or bit (j - tree_base[t]) of tree_mask[t] set (its tree ancestors and itself);
  // a non-tree row of a tree batch has tree_base = INT32_MAX. kv_index[t] - tree_base[t] < 64.
  const uint64_t* tree_mask = nullptr;
  const int32_t* tree_base = nullptr;
  // FP8 E4M3 KV cache (kernels/kv_fp8.h), on the kernel's device: the caches hold e4m3 codes and these
  // f32 [n_slots, n_kv_heads] dequantization scales (value = code * scale); both null for a bf16 / f32
  // cache. Set per layer by the model (each layer has its own scales); kv_write writes them.
  float* k_scales = nullptr;
  float* v_scales = nullptr;
  // Rows [0, n_leading_decode_rows) are single-token causal sequences (plain decode rows: one row each,
  // no tree mask), set by the batch builder (the scheduler puts them first). The CUDA backend runs them
  // through the per-warp decode kernel with its own split plan when the rest of a mixed batch takes the
  // block-shared prefill kernel. 0: unknown / none (always correct, only slower).
  int32_t n_leading_decode_rows = 0;
  bool fp8_kv() const { return k_scales != nullptr; }
};

}  // namespace mxserve::kernels
