// HostCopyEngine for the CUDA backend: page-locked host memory, cudaMemcpyAsync on a side stream, events
// ordering the side stream after the compute stream's earlier work and the compute stream's later work
// after the copies -- all of them (from_host), or layer by layer as the forward reaches each (from_host_layers
// + wait_layer: one event per layer). backend/host_copy.h states the contract. Built only with MXSERVE_HAVE_CUDA.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/host_copy.h"
#include "core/logging.h"

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
    // Experimental until a GPU run proves it: each layer's loads in one cudaMemcpyBatchAsync call instead of one
    // cudaMemcpyAsync per block and tensor (the host cost of issuing them: blocks x tensors calls per load).
    const char* batch = std::getenv("MXSERVE_HOST_TIER_BATCH_COPIES");
    batch_ = batch != nullptr && std::string(batch) == "1";
#if CUDART_VERSION < 13000
    if (batch_)
      return unsupported("MXSERVE_HOST_TIER_BATCH_COPIES=1 needs CUDA 13 (cudaMemcpyBatchAsync); unset it");
#endif
    if (batch_) {
      MX_LOG(kWarn) << "host KV tier: per-layer loads batched (one cudaMemcpyBatchAsync per layer; "
                       "MXSERVE_HOST_TIER_BATCH_COPIES=1, experimental)";
    }
    return Status::ok();
  }
  ~CudaHostCopyEngine() override {
    if (side_ != nullptr) cudaStreamSynchronize(side_);
    for (cudaEvent_t e : layer_events_) cudaEventDestroy(e);
    if (before_ != nullptr) cudaEventDestroy(before_);
    if (after_ != nullptr) cudaEventDestroy(after_);
    if (side_ != nullptr) cudaStreamDestroy(side_);
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  uint64_t host_bytes() const override { return bytes_; }
  bool pinned() const override { return true; }
  uint8_t* host_data() override { return data_; }
  Status to_host(const std::vector<HostCopySpan>& spans) override {
    MX_RETURN_IF_ERROR(wait_all_layers());
    MX_RETURN_IF_ERROR(check_host_copy_spans(spans, bytes_, "to host"));
    return copy(spans, cudaMemcpyDeviceToHost);
  }
  Status from_host(const std::vector<HostCopySpan>& spans) override {
    MX_RETURN_IF_ERROR(wait_all_layers());
    MX_RETURN_IF_ERROR(check_host_copy_spans(spans, bytes_, "from host"));
    return copy(spans, cudaMemcpyHostToDevice);
  }
  Status from_host_layers(const std::vector<std::vector<HostCopySpan>>& layers) override {
    for (size_t l = 0; l < layers.size(); ++l) {
      const Status st = check_host_copy_spans(layers[l], bytes_, "from host");
      if (!st.is_ok()) return invalid_argument("layer " + std::to_string(l) + ": " + st.message());
    }
    MX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    while (layer_events_.size() < layers.size()) {
      cudaEvent_t e = nullptr;
      MX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "layer event"));
      layer_events_.push_back(e);
      layer_pending_.push_back(false);
    }
    MX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(before_, compute_), "event record (compute)"));
    MX_RETURN_IF_ERROR(cuda_status(cudaStreamWaitEvent(side_, before_, 0), "side stream wait"));
    for (size_t l = 0; l < layers.size(); ++l) {
      if (layers[l].empty()) continue;
      MX_RETURN_IF_ERROR(batch_ ? enqueue_batch_to_device(layers[l]) : enqueue(layers[l], cudaMemcpyHostToDevice));
      // Re-recorded by a later call: the side stream runs in order, so the latest record covers them all.
      MX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(layer_events_[l], side_), "layer event record"));
      layer_pending_[l] = true;
    }
    return Status::ok();
  }
  Status wait_layer(size_t layer) override {
    if (layer >= layer_pending_.size() || !layer_pending_[layer]) return Status::ok();
    layer_pending_[layer] = false;
    MX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    return cuda_status(cudaStreamWaitEvent(compute_, layer_events_[layer], 0),
                       "compute stream wait on the loads of layer " + std::to_string(layer));
  }
  Status wait_all_layers() override {
    for (size_t l = 0; l < layer_pending_.size(); ++l) MX_RETURN_IF_ERROR(wait_layer(l));
    return Status::ok();
  }
  void synchronize() override {
    (void)wait_all_layers();
    if (side_ != nullptr) cudaStreamSynchronize(side_);
  }

 private:
  Status enqueue(const std::vector<HostCopySpan>& spans, cudaMemcpyKind kind) {
    for (const auto& s : spans) {
      uint8_t* dev = static_cast<uint8_t*>(s.device->raw()) + s.device_offset;
      uint8_t* host = data_ + s.host_offset;
      void* dst = kind == cudaMemcpyDeviceToHost ? static_cast<void*>(host) : static_cast<void*>(dev);
      const void* src = kind == cudaMemcpyDeviceToHost ? static_cast<const void*>(dev) : static_cast<const void*>(host);
      MX_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dst, src, s.bytes, kind, side_), "cudaMemcpyAsync"));
    }
    return Status::ok();
  }
  // Host -> device, every span in one call on the side stream (stream-ordered sources: the host slots may
  // have been written by an offload enqueued earlier on the same stream).
  Status enqueue_batch_to_device(const std::vector<HostCopySpan>& spans) {
#if CUDART_VERSION >= 13000
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (const auto& s : spans) {
      dsts.push_back(static_cast<uint8_t*>(s.device->raw()) + s.device_offset);
      srcs.push_back(data_ + s.host_offset);
      sizes.push_back(s.bytes);
    }
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeHost;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = device_;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    return cuda_status(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), spans.size(), &attr, &attr_index,
                                            1, side_),
                       "cudaMemcpyBatchAsync of " + std::to_string(spans.size()) + " host-tier copies");
#else
    (void)spans;
    return unsupported("cudaMemcpyBatchAsync needs CUDA 13");
#endif
  }
  Status copy(const std::vector<HostCopySpan>& spans, cudaMemcpyKind kind) {
    if (spans.empty()) return Status::ok();
    MX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    MX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(before_, compute_), "event record (compute)"));
    MX_RETURN_IF_ERROR(cuda_status(cudaStreamWaitEvent(side_, before_, 0), "side stream wait"));
    MX_RETURN_IF_ERROR(enqueue(spans, kind));
    MX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(after_, side_), "event record (side)"));
    return cuda_status(cudaStreamWaitEvent(compute_, after_, 0), "compute stream wait");
  }

  int device_;
  uint64_t bytes_;
  uint8_t* data_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  std::vector<cudaEvent_t> layer_events_;  // from_host_layers: per layer, the end of its copies on side_
  std::vector<bool> layer_pending_;        // recorded and not yet waited by the compute stream
  bool batch_ = false;                     // MXSERVE_HOST_TIER_BATCH_COPIES=1 (experimental)
};

}  // namespace

Result<std::unique_ptr<HostCopyEngine>> make_cuda_host_copy_engine(Backend& be, uint64_t host_bytes) {
  auto e = std::make_unique<CudaHostCopyEngine>(be, host_bytes);
  MX_RETURN_IF_ERROR(e->init());
  return std::unique_ptr<HostCopyEngine>(std::move(e));
}

}  // namespace mxserve::backend
