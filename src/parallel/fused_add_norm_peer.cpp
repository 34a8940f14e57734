// FusedAddNorm on CUDA. Ranks on distinct GPUs (NCCL): the peer all-reduce kernel (parallel/peer_allreduce.h),
// each rank's handle launching on its backend's stream and falling back to its communicator above the staging
// buffers' capacity. Ranks sharing one GPU (the shared-device stand-in): the device-group communicator's
// event-ordered collective (device_group_communicator.h, FusedReduceAddNorm) -- the peer kernels' device spin
// barriers need every rank's kernel running at once, which one GPU does not guarantee (a rank's spinning kernel
// can hold the device queue or the SMs its peer's kernel waits for), so they are never used there.
#include "parallel/fused_add_norm.h"

#include "backend/cuda_backend.h"
#include "kernels/cuda/allreduce/peer_allreduce.h"
#include "parallel/device_group_communicator.h"
#include "parallel/fused_path.h"
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

// The shared-device stand-in: the group's communicator runs it as one of its collectives (events, no spin).
class EventOrderedFusedAddNorm final : public FusedAddNorm {
 public:
  EventOrderedFusedAddNorm(FusedReduceAddNorm* comm, int rank, int world) : comm_(comm), rank_(rank), world_(world) {}
  std::string name() const override {
    return "event-ordered all-reduce + add + RMSNorm, shared-device stand-in (rank " + std::to_string(rank_) + " of " +
           std::to_string(world_) + ")";
  }
  Status allreduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out) override {
    if (x.dim(0) == 0) return Status::ok();  // every rank of the group has the same rows
    return comm_->all_reduce_add_rmsnorm(x, residual, weight, eps, out);
  }

 private:
  FusedReduceAddNorm* comm_;
  int rank_, world_;
};

}  // namespace

Result<std::vector<std::unique_ptr<FusedAddNorm>>> make_fused_add_norm_group(
    const std::vector<backend::Backend*>& backends, const std::vector<int>& devices,
    const std::vector<Communicator*>& fallback) {
  if (backends.size() != devices.size() || backends.size() != fallback.size())
    return invalid_argument("fused all-reduce: " + std::to_string(backends.size()) + " backends, " +
                            std::to_string(devices.size()) + " devices, " + std::to_string(fallback.size()) +
                            " communicators");
  static_assert(kFusedMaxRanks == kernels::cuda::kPeerMaxRanks, "fused_path.h and the peer kernel disagree");
  bool one_device = devices.size() > 1, distinct = true;
  for (size_t r = 0; r < devices.size(); ++r)
    for (size_t p = 0; p < r; ++p) (devices[p] == devices[r] ? distinct : one_device) = false;
  std::vector<std::unique_ptr<FusedAddNorm>> out;
  if (one_device) {  // the shared-device stand-in: the group's communicator orders it by events
    for (size_t r = 0; r < devices.size(); ++r) {
      auto* fused = dynamic_cast<FusedReduceAddNorm*>(fallback[r]);
      if (fused == nullptr)
        return invalid_argument("fused all-reduce: " + std::to_string(devices.size()) + " ranks share device " +
                                std::to_string(devices[0]) + ", but rank " + std::to_string(r) + "'s communicator (" +
                                (fallback[r] ? fallback[r]->name() : std::string("none")) +
                                ") is not the shared-device stand-in's (--communicator shared-device)");
      out.push_back(std::make_unique<EventOrderedFusedAddNorm>(fused, static_cast<int>(r),
                                                               static_cast<int>(devices.size())));
    }
    return out;
  }
  if (!distinct)
    return invalid_argument("fused all-reduce: the ranks' devices repeat only in part; one GPU per rank, or every "
                            "rank on one GPU (the shared-device stand-in)");
  MX_ASSIGN_OR_RETURN(auto peers, make_peer_allreduce_group(devices));
  for (size_t r = 0; r < peers.size(); ++r)
    out.push_back(std::make_unique<PeerFusedAddNorm>(std::move(peers[r]), backends[r], fallback[r]));
  return out;
}

}  // namespace mxserve::parallel
