#include "parallel/graph_join.h"

#include <cuda_runtime.h>

#include "backend/cuda_backend.h"

namespace mxserve::parallel {
namespace {

Status cuda_status(const std::string& what, cudaError_t e) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error("graph join: " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

class CudaGraphJoin final : public GraphJoin {
 public:
  explicit CudaGraphJoin(std::vector<backend::Backend*> be) : be_(std::move(be)) {}
  ~CudaGraphJoin() override {
    for (cudaEvent_t e : events_)
      if (e != nullptr) cudaEventDestroy(e);  // teardown: errors are not actionable here
  }
  Status init() {
    for (backend::Backend* b : be_) streams_.push_back(reinterpret_cast<cudaStream_t>(backend::cuda_backend_stream(*b)));
    events_.assign(be_.size() + 1, nullptr);  // [0]: rank 0's (fork / ordering), [r]: rank r's
    for (cudaEvent_t& e : events_)
      MX_RETURN_IF_ERROR(cuda_status("cudaEventCreate", cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    return Status::ok();
  }

  bool root_capturing() override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(streams_[0], &st) == cudaSuccess && st == cudaStreamCaptureStatusActive;
  }
  Status fork() override { return cuda_status("fork record", cudaEventRecord(events_[0], streams_[0])); }
  Status enter(int r) override {
    if (r != 0) {
      MX_RETURN_IF_ERROR(cuda_status("rank " + std::to_string(r) + " joins", cudaStreamWaitEvent(streams_[r], events_[0], 0)));
      backend::cuda_backend_set_graph_body(*be_[r], true);
    }
    return Status::ok();
  }
  Status leave(int r) override {
    if (r == 0) return Status::ok();
    backend::cuda_backend_set_graph_body(*be_[r], false);
    return cuda_status("rank " + std::to_string(r) + " leaves", cudaEventRecord(events_[r + 1], streams_[r]));
  }
  Status join() override {
    for (size_t r = 1; r < be_.size(); ++r)
      MX_RETURN_IF_ERROR(cuda_status("join rank " + std::to_string(r), cudaStreamWaitEvent(streams_[0], events_[r + 1], 0)));
    return Status::ok();
  }
  Status order_ranks_after_root() override {
    MX_RETURN_IF_ERROR(cuda_status("record on rank 0", cudaEventRecord(events_[0], streams_[0])));
    for (size_t r = 1; r < be_.size(); ++r)
      MX_RETURN_IF_ERROR(cuda_status("rank " + std::to_string(r) + " after rank 0",
                                     cudaStreamWaitEvent(streams_[r], events_[0], 0)));
    return Status::ok();
  }
  Status order_root_after_ranks() override {
    for (size_t r = 1; r < be_.size(); ++r) {
      MX_RETURN_IF_ERROR(cuda_status("record on rank " + std::to_string(r), cudaEventRecord(events_[r + 1], streams_[r])));
      MX_RETURN_IF_ERROR(cuda_status("rank 0 after rank " + std::to_string(r),
                                     cudaStreamWaitEvent(streams_[0], events_[r + 1], 0)));
    }
    return Status::ok();
  }

 private:
  std::vector<backend::Backend*> be_;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

Result<std::unique_ptr<GraphJoin>> make_graph_join(const std::vector<backend::Backend*>& backends) {
  if (backends.empty()) return invalid_argument("graph join: no ranks");
  for (size_t r = 0; r < backends.size(); ++r)
    if (backends[r] == nullptr || backends[r]->device().type != DeviceType::kCUDA ||
        !(backends[r]->device() == backends[0]->device()))
      return unsupported("CUDA graphs at tp > 1 with ranks on several GPUs (rank " + std::to_string(r) + " on " +
                         (backends[r] ? backends[r]->device().to_string() : std::string("none")) +
                         "): the joined capture runs every rank on one GPU (the shared-device stand-in); ranks on "
                         "their own GPUs get per-rank graphs (launch/rank_graphs.h)");
  auto j = std::make_unique<CudaGraphJoin>(backends);
  MX_RETURN_IF_ERROR(j->init());
  return std::unique_ptr<GraphJoin>(std::move(j));
}

}  // namespace mxserve::parallel
