// The reference FusedAddNorm: the three steps (the communicator's all-reduce, the backend's add and RMSNorm)
// behind the fused interface -- the executable spec of the fused seam on the CPU backend, so the forward's
// fused chaining (model/archs/decoder_frame.h) is tested without a GPU.
#include "parallel/fused_add_norm.h"

#include <atomic>

namespace mxserve::parallel {
namespace {

std::atomic<int64_t> g_reference_calls{0};

class ReferenceFusedAddNorm final : public FusedAddNorm {
 public:
  ReferenceFusedAddNorm(backend::Backend* be, Communicator* comm) : be_(be), comm_(comm) {}
  std::string name() const override { return "reference all-reduce, add, RMSNorm (three steps)"; }
  Status allreduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out) override {
    ++g_reference_calls;
    MX_RETURN_IF_ERROR(comm_->all_reduce(x, ReduceOp::kSum));
    be_->add(residual, x);
    be_->rmsnorm(residual, weight, eps, out);
    return Status::ok();
  }

 private:
  backend::Backend* be_;
  Communicator* comm_;
};

}  // namespace

int64_t reference_fused_add_norm_calls() { return g_reference_calls.load(); }

Result<std::vector<std::unique_ptr<FusedAddNorm>>> make_reference_fused_add_norm_group(
    const std::vector<backend::Backend*>& backends, const std::vector<Communicator*>& comms) {
  if (backends.size() != comms.size())
    return invalid_argument("fused all-reduce (reference): " + std::to_string(backends.size()) + " backends, " +
                            std::to_string(comms.size()) + " communicators");
  std::vector<std::unique_ptr<FusedAddNorm>> out;
  for (size_t r = 0; r < backends.size(); ++r)
    out.push_back(std::make_unique<ReferenceFusedAddNorm>(backends[r], comms[r]));
  return out;
}

}  // namespace mxserve::parallel
