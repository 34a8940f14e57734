// FusedAddNorm over the peer all-reduce kernel (parallel/peer_allreduce.h): each rank's handle launches on its
// CUDA backend's stream and falls back to its communicator above the staging buffers' capacity.
#include "parallel/fused_add_norm.h"

#include "backend/cuda_backend.h"
#include "parallel/peer_allreduce.h"

namespace mxserve::parallel {
namespace {

class PeerFusedAddNorm final : public FusedAddNorm {
 public:
  PeerFusedAddNorm(std::unique_ptr<PeerAllReduce> peer, backend::Backend* be, Communicator* fallback)
      : peer_(std::move(peer)), be_(be), fallback_(fallback) {}
  std::string name() const override {
    return "peer all-reduce + add + RMSNorm (rank " + std::to_string(peer_->rank()) + " of " +
           std::to_string(peer_->world()) + ")";
  }
  Status allreduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out) override {
    if (x.dim(0) == 0) return Status::ok();
    return peer_->allreduce_add_rmsnorm(x, residual, weight, eps, out, backend::cuda_backend_stream(*be_), fallback_);
  }
  Status check() override { return peer_->check(backend::cuda_backend_stream(*be_)); }

 private:
  std::unique_ptr<PeerAllReduce> peer_;
  backend::Backend* be_;
  Communicator* fallback_;
};

}  // namespace

Result<std::vector<std::unique_ptr<FusedAddNorm>>> make_fused_add_norm_group(
    const std::vector<backend::Backend*>& backends, const std::vector<int>& devices,
    const std::vector<Communicator*>& fallback) {
  if (backends.size() != devices.size() || backends.size() != fallback.size())
    return invalid_argument("fused all-reduce: " + std::to_string(backends.size()) + " backends, " +
                            std::to_string(devices.size()) + " devices, " + std::to_string(fallback.size()) +
                            " communicators");
  MX_ASSIGN_OR_RETURN(auto peers, make_peer_allreduce_group(devices));
  std::vector<std::unique_ptr<FusedAddNorm>> out;
  for (size_t r = 0; r < peers.size(); ++r)
    out.push_back(std::make_unique<PeerFusedAddNorm>(std::move(peers[r]), backends[r], fallback[r]));
  return out;
}

}  // namespace mxserve::parallel
