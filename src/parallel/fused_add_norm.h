// FusedAddNorm: the tensor-parallel seam "all-reduce this rank's partial sum, add it to the residual stream,
// RMSNorm the result" as one call, so a backend can do all three in one kernel per rank (CUDA:
// parallel/peer_allreduce.h -- one-shot / two-shot by size through peer device memory, NCCL above the staging
// buffers' capacity, as PeerAllReduce decides). model::TensorParallel::reduce_add_norm calls it where it is
// given (the launch makes one group per tp group: make_fused_add_norm_group), else runs the three steps.
// Invariant: every rank of the group gets the same residual bits (one fixed-order f32 sum, rounded once), so
// replicated decisions (router, DSA indexer) stay identical across ranks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace mxserve::parallel {

class FusedAddNorm {
 public:
  virtual ~FusedAddNorm() = default;
  virtual std::string name() const = 0;
  // x [R, C] this rank's partial sum (clobbered); residual [R, C] += sum of every rank's x; out [R, C] =
  // rmsnorm(residual) * weight [C]. bf16 on the rank's device, enqueued on its backend's stream.
  virtual Status allreduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out) = 0;
  // Waits for the calls enqueued so far and reports a failure the device saw (the peer kernel's barrier giving
  // up on a rank); the forward calls it once per step.
  virtual Status check() { return Status::ok(); }
};

// One handle per rank of ONE tp group: backends[i] (CUDA) on devices[i] (the same device may repeat: the
// shared-device stand-in), fallback[i] that rank's communicator of the same group (the NCCL path for tensors
// above the staging capacity). A build without CUDA returns "unsupported".
Result<std::vector<std::unique_ptr<FusedAddNorm>>> make_fused_add_norm_group(
    const std::vector<backend::Backend*>& backends, const std::vector<int>& devices,
    const std::vector<Communicator*>& fallback);

// The reference: comms[i]'s all-reduce, then backends[i]'s add and RMSNorm (any backend; the CPU backend's
// fused seam, fused_add_norm_reference.cpp).
Result<std::vector<std::unique_ptr<FusedAddNorm>>> make_reference_fused_add_norm_group(
    const std::vector<backend::Backend*>& backends, const std::vector<Communicator*>& comms);
// Calls of the reference's allreduce_add_rmsnorm, process-wide (tests assert the fused seam ran).
int64_t reference_fused_add_norm_calls();

}  // namespace mxserve::parallel
