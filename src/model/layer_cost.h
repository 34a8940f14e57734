// Per-layer cost models: the bytes moved and FLOPs of one decoder layer's attention part, owned by each
// architecture (ArchitectureDef::attention_cost, next to the attention it describes) and used by
// `mxserve bench-model` to put its timings against the copy-bandwidth and GEMM ceilings. Weight counts come
// from the declared weights (model/weight_stats.h), never restated. Invariant: a pure function of the
// config and the units: no backend, no allocation.
#pragma once

#include <cstdint>
#include <functional>

namespace mxserve::model {

struct PartCost {
  double bytes = 0;  // bytes read + written
  double flops = 0;
};

// What a cost model needs beyond the config.
struct CostUnits {
  double weight_bytes = 2;            // w: bytes per stored dense weight element
  double act_bytes = 2;               // a: bytes per activation (and unquantized cache) element
  bool fp8_kv = false;                // --kv-cache-dtype fp8_e4m3: cached K/V are FP8 codes + f32 scales
  int64_t attn_dense_params = 0;      // the layer's declared self_attn parameters (block_weights)
  int64_t attn_matmul_params = 0;     // of them Linear weights (2 FLOPs per parameter per token)
};

struct AttentionCost {
  std::function<PartCost(double rows, double ctx)> decode;  // `rows` decode rows, each at context ctx
  std::function<PartCost(double p)> prefill;                // one causal chunk of p tokens from position 0
};

}  // namespace mxserve::model
