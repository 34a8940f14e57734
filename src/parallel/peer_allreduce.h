// The fused all-reduce of tensor parallelism on one node: the ranks (threads of this process, one GPU
// each) sum their partial outputs through each other's staging buffers (plain peer device pointers,
// cudaDeviceEnablePeerAccess) and apply the residual add + RMSNorm that follows in the same kernel
// (kernels/cuda/allreduce/peer_allreduce.h has the math and the flag protocol):
//     residual += sum over ranks of x;  out = rmsnorm(residual) * weight
// Path by the size of x (bytes = rows x cols x 2), chosen alike on every rank:
//     bytes > capacity_bytes          NCCL all-reduce of x, then local (logged once, as a warning)
//     world == 1                      local (the add + RMSNorm alone)
//     bytes <= one_shot_max_bytes     one-shot   (every rank reads every input)
//     else                            two-shot   (reduce-scatter + all-gather through the buffers)
// Each path is logged once per group the first time it runs.
// Invariant: every rank of the group calls allreduce_add_rmsnorm with the same shapes in the same order
// (the flag epochs advance in lockstep). A barrier that waits ~10 s gives up and check() reports it.
// Built only in CUDA builds (mxserve_parallel_gpu).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

struct CUstream_st;

namespace mxserve::parallel {

struct PeerAllReduceOptions {
  uint64_t capacity_bytes = 8ull << 20;       // each rank's staging buffer (x's bytes); above: NCCL
  uint64_t one_shot_max_bytes = 256ull << 10;  // one-shot up to here, two-shot above
  int max_blocks = 32;                         // blocks per rank's kernel (1..64; all ranks resident)
};

enum class FusedPath { kLocal, kOneShot, kTwoShot, kNccl };
const char* fused_path_name(FusedPath p);

class PeerAllReduceGroup;

// One rank's handle on the group. Use from that rank's thread only.
class PeerAllReduce {
 public:
  PeerAllReduce(std::shared_ptr<PeerAllReduceGroup> group, int rank);
  ~PeerAllReduce();
  int rank() const { return rank_; }
  int world() const;
  FusedPath path_for(uint64_t bytes) const;
  // x, residual, out: bf16 [R, C] on this rank's device; weight bf16 [C]. x is clobbered on the NCCL path
  // (which needs `fallback`, this rank's communicator of the same group). Enqueued on `stream`.
  Status allreduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out,
                               CUstream_st* stream, Communicator* fallback);
  // Synchronizes `stream` and reports a barrier that timed out on this rank since the group was made.
  Status check(CUstream_st* stream);

 private:
  std::shared_ptr<PeerAllReduceGroup> group_;
  int rank_;
};

// One handle per rank, rank r on devices[r] (the same device may repeat: one-GPU tests stand peers in on
// one device). Allocates the staging buffers and flags, enables peer access between distinct devices.
Result<std::vector<std::unique_ptr<PeerAllReduce>>> make_peer_allreduce_group(const std::vector<int>& devices,
                                                                              const PeerAllReduceOptions& options = {});

}  // namespace mxserve::parallel
