// The memory and link plan of a layout (`mxserve memory`, docs/parallel.md): per-GPU weight bytes computed from
// the architecture's weight table sharded for every rank of the layout (parallel/shard.h, the loader's own
// slicing), stored as a precision plan says (bf16, MXFP4 = 4-bit codes + one e8m0 scale per 32, FP8-block =
// 1-byte codes + one f32 scale per 128 x 128), the KV cache bytes per token per rank (the layout kv_spec builds
// for glm4_moe / glm_moe_dsa) and the tokens that fit in a GPU's memory, and the bytes per token each rank
// sends over the links per decode step (ring all-reduces, the DP-attention MoE exchange, the logits gather,
// and the all-to-all alternative for EP). A pure function of the config: no backend, no weights read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kvcache/kv_cache.h"
#include "model/config.h"
#include "model/synthetic_weights.h"
#include "model/weight_table.h"
#include "parallel/rank_layout.h"

namespace mxserve::cli {

struct MemoryOptions {
  uint64_t gpu_bytes = 0;           // 0: no KV capacity computed
  double gpu_utilization = 0.9;     // the share of gpu_bytes for weights + KV (vLLM's --gpu-memory-utilization)
  kvcache::KvCacheDtype kv_dtype = kvcache::KvCacheDtype::kAuto;
  bool mtp = false;                 // the MTP layer's weights and KV (speculative decoding)
  int act_bytes = 2;                // activation element bytes on the links (bf16)
};

struct LinkBytes {
  // Per decode token, per rank, bytes sent (ring algorithms: an all-reduce of n bytes sends 2 (g-1)/g n).
  double all_reduce_payload = 0;     // one all-reduce's payload per token: hidden_size x activation bytes
  int64_t tp_all_reduces = 0;        // count per token per forward (tp group)
  double tp_all_reduce_bytes = 0;    // their ring bytes
  double moe_exchange_bytes = 0;     // DP attention: all-gather + reduce-scatter of H over all ranks per MoE layer
  double logits_bytes = 0;           // the vocabulary-parallel logits all-gather (f32, one row per token)
  double all_to_all_bytes = 0;       // EP by all-to-all dispatch + combine (not built): expected, uniform routing
  double total_as_built() const { return tp_all_reduce_bytes + moe_exchange_bytes + logits_bytes; }
};

struct MemoryPlan {
  std::string layout;                 // "tp 4 x dp 2 (DP attention), ep 8"
  int world = 1;
  uint64_t weight_bytes_max = 0;      // the fullest rank's weights
  uint64_t weight_bytes_min = 0;
  uint64_t weight_bytes_total = 0;    // the whole model once (one rank, same plan)
  uint64_t kv_bytes_per_token = 0;    // per rank (its heads; MLA: the whole latent, replicated over tp)
  int64_t kv_tokens_per_rank = 0;     // tokens of KV that fit next to the weights (gpu_bytes given)
  int64_t kv_tokens_total = 0;        // over the DP groups (each caches its own requests)
  uint64_t kv_budget_bytes = 0;       // gpu_bytes x utilization - weights (<= 0: does not fit)
  bool fits = true;
  std::vector<std::string> notes;     // what the numbers leave out, loudly
  LinkBytes links;
};

// Bytes of one weight stored under the plan (shape = the rank's shard).
uint64_t stored_weight_bytes(const model::WeightSpec& spec, const Shape& shape, const model::SyntheticPlan& plan);

Result<MemoryPlan> plan_memory(const model::ModelConfig& cfg, const parallel::ParallelConfig& p,
                               const model::SyntheticPlan& plan, const MemoryOptions& options);

std::string format_memory_plan(const MemoryPlan& m, const MemoryOptions& options);
std::string memory_plan_json(const MemoryPlan& m);

}  // namespace mxserve::cli
