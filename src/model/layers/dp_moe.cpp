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

}  // namespace mxserve::model
