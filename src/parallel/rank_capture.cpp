// RankCapture over CUDA events and streams (see rank_capture.h).
#include "parallel/rank_capture.h"

#include <cuda_runtime.h>

#include <string>

#include "backend/cuda_backend.h"
#include "core/logging.h"

namespace mxserve::parallel {
namespace {

Status cuda_status(const std::string& what, cudaError_t e) {
  if (e == cudaSuccess) return Status::ok();
  (void)cudaGetLastError();
  return internal_error("per-rank graphs: " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

class CudaRankCapture final : public RankCapture {
 public:
  CudaRankCapture(std::vector<backend::Backend*> be, std::vector<int> devices)
      : be_(std::move(be)), devices_(std::move(devices)) {}
  ~CudaRankCapture() override {
    for (cudaEvent_t e : events_)
      if (e != nullptr) cudaEventDestroy(e);  // teardown: errors are not actionable here
  }
  Status init() {
    int restore = 0;
    MX_RETURN_IF_ERROR(cuda_status("cudaGetDevice", cudaGetDevice(&restore)));
    events_.assign(be_.size(), nullptr);
    for (size_t r = 0; r < be_.size(); ++r) {
      streams_.push_back(reinterpret_cast<cudaStream_t>(backend::cuda_backend_stream(*be_[r])));
      MX_RETURN_IF_ERROR(cuda_status("cudaSetDevice " + std::to_string(devices_[r]), cudaSetDevice(devices_[r])));
      MX_RETURN_IF_ERROR(cuda_status("cudaEventCreate on rank " + std::to_string(r),
                                     cudaEventCreateWithFlags(&events_[r], cudaEventDisableTiming)));
      // Direct peer reads of rank 0's inputs where the link allows (else the copies are staged by the driver).
      if (r > 0 && devices_[r] != devices_[0]) {
        int can = 0;
        (void)cudaDeviceCanAccessPeer(&can, devices_[r], devices_[0]);
        const cudaError_t e = can ? cudaDeviceEnablePeerAccess(devices_[0], 0) : cudaErrorPeerAccessUnsupported;
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
          (void)cudaGetLastError();
          MX_LOG(kWarn) << "per-rank CUDA graphs: GPU " << devices_[r] << " cannot read GPU " << devices_[0]
                        << " directly (" << cudaGetErrorName(e) << "): rank " << r
                        << "'s input copies go through the driver's staging (slower steps)";
        }
      }
    }
    return cuda_status("cudaSetDevice " + std::to_string(restore), cudaSetDevice(restore));
  }

  bool root_capturing() override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(streams_[0], &st) == cudaSuccess && st == cudaStreamCaptureStatusActive;
  }
  Status mark_root() override { return cuda_status("record on rank 0", cudaEventRecord(events_[0], streams_[0])); }
  Status wait_root(int r) override {
    if (r == 0) return Status::ok();
    return cuda_status("rank " + std::to_string(r) + " waits for rank 0's inputs",
                       cudaStreamWaitEvent(streams_[r], events_[0], 0));
  }
  Status copy_from_root(int r, const Tensor& src, Tensor& dst) override {
    if (src.nbytes() != dst.nbytes() || !src.is_contiguous() || !dst.is_contiguous())
      return internal_error("per-rank graphs: rank " + std::to_string(r) + " input copy " + src.describe() + " -> " +
                            dst.describe());
    if (src.nbytes() == 0) return Status::ok();
    // cudaMemcpyDefault over unified addressing: the same call for a peer GPU and for rank 0's own device, and
    // captured as one memcpy node either way.
    const cudaError_t e = cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault, streams_[r]);
    return cuda_status("rank " + std::to_string(r) + " copies rank 0's " + src.describe(), e);
  }
  Result<std::unique_ptr<backend::DeviceGraph>> capture(int r, const std::function<void()>& body) override {
    return backend::cuda_backend_capture_graph_thread_local(*be_[r], body);
  }
  Status launch(int r, backend::DeviceGraph& graph) override { return backend::cuda_graph_try_replay(graph); }
  Status mark_rank(int r) override {
    if (r == 0) return Status::ok();
    return cuda_status("record on rank " + std::to_string(r), cudaEventRecord(events_[r], streams_[r]));
  }
  Status join_ranks() override {
    for (size_t r = 1; r < be_.size(); ++r)
      MX_RETURN_IF_ERROR(cuda_status("rank 0 after rank " + std::to_string(r),
                                     cudaStreamWaitEvent(streams_[0], events_[r], 0)));
    return Status::ok();
  }

 private:
  std::vector<backend::Backend*> be_;
  std::vector<int> devices_;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

Result<std::unique_ptr<RankCapture>> make_rank_capture(const std::vector<backend::Backend*>& backends,
                                                       const std::vector<int>& devices) {
  if (backends.empty() || backends.size() != devices.size())
    return invalid_argument("per-rank graphs: " + std::to_string(backends.size()) + " backends, " +
                            std::to_string(devices.size()) + " devices");
  for (size_t r = 0; r < backends.size(); ++r)
    if (backends[r] == nullptr || backends[r]->device().type != DeviceType::kCUDA)
      return invalid_argument("per-rank graphs: rank " + std::to_string(r) + " has no CUDA backend");
  auto c = std::make_unique<CudaRankCapture>(backends, devices);
  MX_RETURN_IF_ERROR(c->init());
  return std::unique_ptr<RankCapture>(std::move(c));
}

}  // namespace mxserve::parallel
