// HostCopyEngine for the CUDA backend: page-locked host memory, cudaMemcpyAsync on a side stream, events
// ordering the side stream after the compute stream's earlier work and the compute stream's later work
// after the copies (backend/host_copy.h states the contract). Built only with MXSERVE_HAVE_CUDA.
#include <cuda_runtime_api.h>

#include <string>

#include "backend/cuda_backend.h"
#include "backend/host_copy.h"

namespace mxserve::backend {
namespace {

Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error("--kv-cache-host-memory: " + what + ": " + cudaGetErrorString(e));
}

class CudaHostCopyEngine final : public HostCopyEngine {
 public:
  CudaHostCopyEngine(Backend& be, uint64_t bytes) : device_(be.device().index), bytes_(bytes) {
    compute_ = reinterpret_cast<cudaStream_t>(cuda_backend_stream(be));
  }
  Status init() {
    MX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    if (bytes_ > 0)
      MX_RETURN_IF_ERROR(cuda_status(cudaHostAlloc(reinterpret_cast<void**>(&data_), bytes_, cudaHostAllocDefault),
                                     "cudaHostAlloc of " + std::to_string(bytes_) + " pinned bytes"));
    MX_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "side stream"));
    MX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming), "event"));
    MX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming), "event"));
    return Status::ok();
  }
  ~CudaHostCopyEngine() override {
    if (side_ != nullptr) cudaStreamSynchronize(side_);
    if (before_ != nullptr) cudaEventDestroy(before_);
    if (after_ != nullptr) cudaEventDestroy(after_);
    if (side_ != nullptr) cudaStreamDestroy(side_);
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  uint64_t host_bytes() const override { return bytes_; }
  bool pinned() const override { return true; }
  uint8_t* host_data() override { return data_; }
  Status to_host(const std::vector<HostCopySpan>& spans) override {
    MX_RETURN_IF_ERROR(check_host_copy_spans(spans, bytes_, "to host"));
    return copy(spans, cudaMemcpyDeviceToHost);
  }
  Status from_host(const std::vector<HostCopySpan>& spans) override {
    MX_RETURN_IF_ERROR(check_host_copy_spans(spans, bytes_, "from host"));
    return copy(spans, cudaMemcpyHostToDevice);
  }
  void synchronize() override {
    if (side_ != nullptr) cudaStreamSynchronize(side_);
  }

 private:
  Status copy(const std::vector<HostCopySpan>& spans, cudaMemcpyKind kind) {
    if (spans.empty()) return Status::ok();
    MX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    MX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(before_, compute_), "event record (compute)"));
    MX_RETURN_IF_ERROR(cuda_status(cudaStreamWaitEvent(side_, before_, 0), "side stream wait"));
    for (const auto& s : spans) {
      uint8_t* dev = static_cast<uint8_t*>(s.device->raw()) + s.device_offset;
      uint8_t* host = data_ + s.host_offset;
      void* dst = kind == cudaMemcpyDeviceToHost ? static_cast<void*>(host) : static_cast<void*>(dev);
      const void* src = kind == cudaMemcpyDeviceToHost ? static_cast<const void*>(dev) : static_cast<const void*>(host);
      MX_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dst, src, s.bytes, kind, side_), "cudaMemcpyAsync"));
    }
    MX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(after_, side_), "event record (side)"));
    return cuda_status(cudaStreamWaitEvent(compute_, after_, 0), "compute stream wait");
  }

  int device_;
  uint64_t bytes_;
  uint8_t* data_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<HostCopyEngine>> make_cuda_host_copy_engine(Backend& be, uint64_t host_bytes) {
  auto e = std::make_unique<CudaHostCopyEngine>(be, host_bytes);
  MX_RETURN_IF_ERROR(e->init());
  return std::unique_ptr<HostCopyEngine>(std::move(e));
}

}  // namespace mxserve::backend
