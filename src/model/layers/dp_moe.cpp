#include "model/layers/dp_moe.h"

namespace mxserve::model {

Result<Tensor> DpMoeExchange::forward(backend::Backend& be, const ModelConfig& cfg, const MoeBlock& moe,
                                      const Tensor& h) const {
  const int64_t T = h.dim(0);
  const int n_tp = tp != nullptr ? tp->size() : 1, tp_rank = tp != nullptr ? tp->rank() : 0;
  const int64_t begin = T * tp_rank / n_tp, end = T * (tp_rank + 1) / n_tp;
  std::vector<int64_t> rows;
  MX_ASSIGN_OR_RETURN(Tensor gathered, world->all_gather_v(h.slice_rows(begin, end), &rows));
  Tensor partial = be.alloc(be.activation_dtype(), {gathered.dim(0), cfg.d_model});
  if (gathered.dim(0) > 0) moe.forward(be, cfg, gathered, partial);  // every rank sees the same total
  MX_ASSIGN_OR_RETURN(Tensor mine, world->reduce_scatter_v(partial, rows, parallel::ReduceOp::kSum));
  if (tp == nullptr) return mine;
  return tp->all_gather_v(mine, nullptr);
}

Status DpMoeExchange::mlp(backend::Backend& be, const ModelConfig& cfg, const std::variant<SwigluMlp, MoeBlock>& mlp,
                         TensorParallel& tp_group, const Tensor& h, Tensor& o, bool reduce) const {
  const auto* moe = std::get_if<MoeBlock>(&mlp);
  if (moe != nullptr && enabled()) {  // DP: the MoE block over every DP group's tokens
    MX_ASSIGN_OR_RETURN(o, forward(be, cfg, *moe, h));
    return Status::ok();
  }
  if (moe != nullptr) moe->forward(be, cfg, h, o);
  else std::get<SwigluMlp>(mlp).forward(be, h, o);
  if (!reduce) return Status::ok();    // the caller's fused all-reduce + add + RMSNorm sums it
  return tp_group.reduce_partial(o);  // TP: shared + routed experts' partial sums together
}

Status DpMoeExchange::idle(backend::Backend& be, const ModelConfig& cfg, const std::vector<const MoeBlock*>& blocks) const {
  const Tensor none = be.alloc(be.activation_dtype(), {0, cfg.d_model});
  for (const MoeBlock* moe : blocks) MX_RETURN_IF_ERROR(forward(be, cfg, *moe, none).status());
  return Status::ok();
}

}  // namespace mxserve::model
