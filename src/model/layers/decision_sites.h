// The decision sites of the MoE router and the DSA indexer (model/decisions.h): called by MoeBlock and
// DsaIndexer only when a DecisionHook is installed, after the backend made its own decision. Each one reads the
// scores behind the decision back to the host (backend-independent: Backend::to_host), computes every row's
// margin and scale in double, hands the rows to the hook and, when the hook forced other ids, writes them (and,
// for routing, the routing weights they imply, from this backend's own un-biased sigmoid scores) back to the
// backend in place of its own. Slow by design (host round trips): a verification tool, never the serving path.
#pragma once

#include <string>

#include "backend/backend.h"
#include "kernels/mla_params.h"
#include "model/decisions.h"

namespace mxserve::model {

// "model.layers.12.mlp." -> 12; -1 when the prefix names no layer.
int64_t layer_of_prefix(const std::string& prefix);

// After Backend::router: x [T, H], gate [E, H], bias f32 [E]; ids i32 [T, k], weights f32 [T, k] (replaced when
// the hook forces other experts). Group-limited selection as kernels/cpu/moe_router.cpp defines it.
void routing_decision(backend::Backend& be, const Tensor& x, const Tensor& gate, const Tensor& bias,
                      const kernels::RouterParams& rp, int64_t layer, DecisionHook& hook, Tensor& ids,
                      Tensor& weights);

// After MlaDsaOps::indexer_topk: q [T, NH * D] (roped), w [T, NH], key_cache [slots, D], topk i32 [T, K]
// (replaced when the hook forces other keys). Tree batches (speculative verification) are not observed.
void index_decision(backend::Backend& be, const Tensor& q, const Tensor& w, const Tensor& key_cache,
                    const backend::AttentionMeta& meta, const kernels::IndexerParams& ip, int64_t layer,
                    DecisionHook& hook, Tensor& topk);

}  // namespace mxserve::model
