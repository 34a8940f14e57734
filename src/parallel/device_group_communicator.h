// The device-group communicator: N ranks of one process whose tensors live in ONE memory (one GPU for the
// shared-device stand-in, parallel/shared_device_communicator.h; host memory in the CPU unit test). Every
// rank reads the other ranks' inputs in place, so a collective is a host rendezvous plus copies and a
// rank-order reduction that each rank enqueues on its own stream. The device side is RankDeviceOps (per
// rank: its stream, its allocator, its events); this file owns the host logic: posts, the two barriers,
// shape checks, the copy plans, poisoning.
// Protocol per collective (every rank): post the input, record "input ready" -> barrier 1 -> check the op and
// shapes against every post -> wait for every rank's "input ready" -> enqueue this rank's copies / reduction
// into a fresh output -> record "reads done" -> barrier 2 -> wait for every rank's "reads done" (so a later
// write or free of this rank's input, in-place all_reduce included, is ordered after all reads of it).
// The fused all-reduce + residual add + RMSNorm (FusedReduceAddNorm below) is one more collective of the same
// protocol: its compute step is ONE kernel per rank that reads every rank's input in place and writes this
// rank's residual and normed output -- ordered by stream events, never by a device spin barrier, so it cannot
// deadlock however the ranks' kernels are scheduled on the one device.
// Invariants:
//  - Deterministic: reductions sum (or max) in rank order 0..N-1 in f32 (bf16 / f16 inputs are rounded once,
//    at the end), so every rank gets the same bits as the CPU communicator on the same values.
//  - No hang: the device never waits on an event that has not been recorded (waits come after barrier 1 /
//    2); abort() or a timeout poisons the group and every pending and later collective returns an error
//    naming the rank at fault.
//  - Checked: every rank calls the same collective with matching dtypes and shapes; a mismatch is the same
//    error on every rank, naming the op, the ranks and the shapes.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace mxserve::parallel {

// One rank's device side. Copies and reductions are enqueued on the rank's stream (asynchronous);
// pointers may belong to any rank of the group (one memory).
class RankDeviceOps {
 public:
  enum class Mark { kInputReady, kReadsDone };
  virtual ~RankDeviceOps() = default;
  virtual Device device() const = 0;                          // where this rank's tensors must live
  virtual Tensor alloc(DType dtype, const Shape& shape) = 0;  // from this rank's allocator
  virtual Status copy(void* dst, const void* src, int64_t bytes) = 0;
  // rows rows of width bytes, from src (row pitch spitch) to dst (row pitch dpitch).
  virtual Status copy_2d(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows) = 0;
  // dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... in that order, accumulated in f32, i < n; dtype f32, bf16 or f16.
  virtual Status reduce(void* dst, const std::vector<const void*>& srcs, int64_t n, DType dtype, ReduceOp op) = 0;
  // Fused all-reduce + residual add + RMSNorm over rows x cols elements of `dtype` (bf16 on the GPU; f32 or
  // bf16 in host memory): s = srcs[0] + ... + srcs[n-1] in f32 in rank order; residual = round(residual + s);
  // out = round(weight * residual / sqrt(mean(residual^2) + eps)) per row. A side without it says so.
  virtual Status reduce_add_rmsnorm(const std::vector<const void*>& srcs, void* residual, const void* weight,
                                    void* out, int64_t rows, int64_t cols, float eps, DType dtype) {
    return unsupported("this rank's device side has no fused all-reduce + add + RMSNorm");
  }
  // Records `mark` on this rank's stream (after the work enqueued so far).
  virtual Status record(Mark mark) = 0;
  // This rank's stream waits until `other`'s latest `mark` has passed (other's record came before this call).
  virtual Status wait_for(RankDeviceOps& other, Mark mark) = 0;
};

// What a device-group communicator offers beyond Communicator (reach it with dynamic_cast): the fused
// all-reduce + residual add + RMSNorm as one collective of the protocol above (parallel/fused_add_norm.h uses
// it on the shared-device stand-in). x [R, C] is read by every rank in place (not modified); residual [R, C]
// += the rank-order sum of every rank's x; out [R, C] = rmsnorm(residual) * weight [C]; all on this rank's
// device, the same dtype, contiguous; out must not alias x or residual. Every rank brings the same shapes.
class FusedReduceAddNorm {
 public:
  virtual ~FusedReduceAddNorm() = default;
  virtual Status all_reduce_add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps,
                                        Tensor& out) = 0;
};

struct DeviceGroupOptions {
  // How long one rank waits at a collective for the others before the group is declared failed.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string name = "device-group";  // name() is "<name> x<N>"
};

// One communicator per layout (rank order, layouts[r].rank == r), sharing one group; ops[r] is rank r's
// device side. Each communicator is used by one thread at a time (its rank's).
Result<std::vector<std::unique_ptr<Communicator>>> make_device_group_communicators(
    const std::vector<RankLayout>& layouts, std::vector<std::unique_ptr<RankDeviceOps>> ops,
    const DeviceGroupOptions& options = {});

// Host-memory RankDeviceOps (synchronous memcpy and a CPU rank-order reduction; marks are no-ops): the
// device-group logic tested without a GPU (tests/unit/parallel/test_device_group_communicator.cpp).
std::unique_ptr<RankDeviceOps> make_host_rank_ops();

}  // namespace mxserve::parallel
