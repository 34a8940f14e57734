// The CUDA side of the shared-device communicator: RankDeviceOps over one rank's CUDA backend (its stream, its
// allocator, two events), plugged into the device-group communicator (device_group_communicator.h).
#include "parallel/shared_device_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "core/logging.h"
#include "parallel/device_group_communicator.h"
#include "parallel/shared_device_reduce.h"
#include "kernels/cuda/allreduce/peer_allreduce.h"

namespace mxserve::parallel {
namespace {

Status cuda_status(const std::string& what, cudaError_t e) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

class CudaRankOps final : public RankDeviceOps {
 public:
  explicit CudaRankOps(backend::Backend* be)
      : be_(be), stream_(reinterpret_cast<cudaStream_t>(backend::cuda_backend_stream(*be))) {}
  ~CudaRankOps() override {
    for (cudaEvent_t e : events_)
      if (e != nullptr) cudaEventDestroy(e);  // teardown: errors are not actionable here
  }
  Status init() {
    MX_RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(be_->device().index)));
    for (cudaEvent_t& e : events_)
      MX_RETURN_IF_ERROR(cuda_status("cudaEventCreate", cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    return Status::ok();
  }

  Device device() const override { return be_->device(); }
  Tensor alloc(DType dtype, const Shape& shape) override { return be_->alloc(dtype, shape); }
  Status copy(void* dst, const void* src, int64_t bytes) override {
    return cuda_status("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  Status copy_2d(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows) override {
    return cuda_status("cudaMemcpy2DAsync",
                       cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, stream_));
  }
  Status reduce(void* dst, const std::vector<const void*>& srcs, int64_t n, DType dtype, ReduceOp op) override {
    const int elem = dtype == DType::kF32 ? 0 : dtype == DType::kBF16 ? 1 : dtype == DType::kF16 ? 2 : -1;
    if (elem < 0) return unsupported(std::string("the shared-device reduction: f32, bf16 or f16, got ") + dtype_name(dtype));
    return cuda_status("the rank-order reduction kernel",
                       launch_rank_order_reduce(dst, srcs.data(), static_cast<int>(srcs.size()), n, elem,
                                                op == ReduceOp::kMax, stream_));
  }
  // The direct peer kernel (kernels/cuda/allreduce/peer_allreduce.h, PeerAlgo::kDirect): every rank's x read
  // in place, no barrier (the device-group protocol's events order it).
  Status reduce_add_rmsnorm(const std::vector<const void*>& srcs, void* residual, const void* weight, void* out,
                            int64_t rows, int64_t cols, float eps, DType dtype) override {
    namespace kc = kernels::cuda;
    if (dtype != DType::kBF16)
      return unsupported(std::string("the shared-device fused all-reduce + add + RMSNorm takes bf16, got ") +
                         dtype_name(dtype));
    if (srcs.empty() || static_cast<int>(srcs.size()) > kc::kPeerMaxRanks)
      return unsupported("the shared-device fused all-reduce + add + RMSNorm: " + std::to_string(srcs.size()) +
                         " ranks (1.." + std::to_string(kc::kPeerMaxRanks) + ")");
    kc::PeerAllReduceArgs a;
    a.world = static_cast<int>(srcs.size());
    a.rank = 0;  // unused by the direct kernel
    for (int r = 0; r < a.world; ++r) a.buffers[r] = const_cast<void*>(srcs[r]);
    a.x = srcs[0];
    a.residual = residual;
    a.weight = weight;
    a.out = out;
    a.rows = rows;
    a.cols = cols;
    a.eps = eps;
    const int blocks = static_cast<int>(std::min<int64_t>(kc::kPeerMaxBlocks, std::max<int64_t>(1, rows)));
    return cuda_status("the direct fused all-reduce + add + RMSNorm kernel",
                       kc::launch_peer_allreduce_rmsnorm(a, kc::PeerAlgo::kDirect, blocks, stream_));
  }
  Status record(Mark mark) override { return cuda_status("cudaEventRecord", cudaEventRecord(event(mark), stream_)); }
  Status wait_for(RankDeviceOps& other, Mark mark) override {
    return cuda_status("cudaStreamWaitEvent",
                       cudaStreamWaitEvent(stream_, static_cast<CudaRankOps&>(other).event(mark), 0));
  }

 private:
  cudaEvent_t event(Mark mark) const { return events_[mark == Mark::kInputReady ? 0 : 1]; }

  backend::Backend* be_;
  cudaStream_t stream_;
  cudaEvent_t events_[2] = {nullptr, nullptr};  // kInputReady, kReadsDone
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_shared_device_communicators(
    const std::vector<RankLayout>& layouts, const std::vector<backend::Backend*>& backends,
    const SharedDeviceOptions& options) {
  const int n = static_cast<int>(layouts.size());
  if (n < 1 || static_cast<int>(backends.size()) != n)
    return invalid_argument("make_shared_device_communicators: " + std::to_string(n) + " rank(s) and " +
                            std::to_string(backends.size()) + " backend(s)");
  if (n > kMaxSharedDeviceRanks)
    return invalid_argument("the shared-device communicator runs at most " + std::to_string(kMaxSharedDeviceRanks) +
                            " ranks on one GPU, asked for " + std::to_string(n));
  std::vector<std::unique_ptr<RankDeviceOps>> ops;
  for (int r = 0; r < n; ++r) {
    backend::Backend* be = backends[r];
    if (be == nullptr || be->device().type != DeviceType::kCUDA || be->device() != backends[0]->device())
      return invalid_argument("make_shared_device_communicators: " + layouts[r].describe() +
                              " needs a CUDA backend on the device of rank 0's, got " +
                              (be ? be->name() + " on " + be->device().to_string() : std::string("none")));
    auto o = std::make_unique<CudaRankOps>(be);
    MX_RETURN_IF_ERROR(o->init().with_context(layouts[r].describe()));
    ops.push_back(std::move(o));
  }
  DeviceGroupOptions go;
  go.timeout = options.timeout;
  go.name = "shared-device";
  MX_ASSIGN_OR_RETURN(auto comms, make_device_group_communicators(layouts, std::move(ops), go));
  MX_LOG(kInfo) << "shared-device communicator: " << n << " rank(s) on one GPU (" << backends[0]->device().to_string()
                << "), for tests and benchmarks only; collectives through device memory, not NVLink";
  return comms;
}

}  // namespace mxserve::parallel
