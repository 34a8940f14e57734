// HostCopyEngine for the CPU backend (memcpy into a plain host buffer) and the dispatch by backend.
#include "backend/host_copy.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace mxserve::backend {

#ifdef MXSERVE_HAVE_CUDA
Result<std::unique_ptr<HostCopyEngine>> make_cuda_host_copy_engine(Backend& be, uint64_t host_bytes);
#endif

Status check_host_copy_spans(const std::vector<HostCopySpan>& spans, uint64_t host_bytes, const char* direction) {
  for (size_t i = 0; i < spans.size(); ++i) {
    const HostCopySpan& s = spans[i];
    if (s.device == nullptr || !s.device->is_contiguous() || s.device_offset + s.bytes > s.device->nbytes() ||
        s.host_offset + s.bytes > host_bytes)
      return invalid_argument(std::string("host copy (") + direction + "): span " + std::to_string(i) +
                              " (device offset " + std::to_string(s.device_offset) + ", host offset " +
                              std::to_string(s.host_offset) + ", " + std::to_string(s.bytes) +
                              " bytes) lies outside its tensor (" +
                              (s.device ? s.device->describe() : std::string("null")) + ") or the host buffer (" +
                              std::to_string(host_bytes) + " bytes)");
  }
  return Status::ok();
}

namespace {

class CpuHostCopyEngine final : public HostCopyEngine {
 public:
  explicit CpuHostCopyEngine(uint64_t bytes) : bytes_(bytes) {}
  Status init() {
    if (bytes_ == 0) return Status::ok();
    data_ = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes_ + 63) / 64 * 64));
    if (data_ == nullptr)
      return out_of_memory("--kv-cache-host-memory: cannot allocate " + std::to_string(bytes_) + " host bytes");
    return Status::ok();
  }
  ~CpuHostCopyEngine() override { std::free(data_); }
  uint64_t host_bytes() const override { return bytes_; }
  bool pinned() const override { return false; }
  uint8_t* host_data() override { return data_; }
  Status to_host(const std::vector<HostCopySpan>& spans) override {
    MX_RETURN_IF_ERROR(wait_all_layers());
    MX_RETURN_IF_ERROR(check_host_copy_spans(spans, bytes_, "to host"));
    for (const auto& s : spans)
      std::memcpy(data_ + s.host_offset, static_cast<const uint8_t*>(s.device->raw()) + s.device_offset, s.bytes);
    return Status::ok();
  }
  Status from_host(const std::vector<HostCopySpan>& spans) override {
    MX_RETURN_IF_ERROR(wait_all_layers());
    MX_RETURN_IF_ERROR(check_host_copy_spans(spans, bytes_, "from host"));
    copy_in(spans);
    return Status::ok();
  }
  // Kept until waited on: the CPU has no copy engine to overlap with, but a forward that read a layer before
  // waiting for it reads stale bytes here exactly as it would race on the GPU (the tests rely on it).
  Status from_host_layers(const std::vector<std::vector<HostCopySpan>>& layers) override {
    for (size_t l = 0; l < layers.size(); ++l) {
      const Status st = check_host_copy_spans(layers[l], bytes_, "from host");
      if (!st.is_ok()) return invalid_argument("layer " + std::to_string(l) + ": " + st.message());
    }
    if (pending_.size() < layers.size()) pending_.resize(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) pending_[l].insert(pending_[l].end(), layers[l].begin(), layers[l].end());
    return Status::ok();
  }
  Status wait_layer(size_t layer) override {
    if (layer >= pending_.size()) return Status::ok();
    copy_in(pending_[layer]);
    pending_[layer].clear();
    return Status::ok();
  }
  Status wait_all_layers() override {
    for (size_t l = 0; l < pending_.size(); ++l) MX_RETURN_IF_ERROR(wait_layer(l));
    return Status::ok();
  }
  void synchronize() override { (void)wait_all_layers(); }

 private:
  void copy_in(const std::vector<HostCopySpan>& spans) {
    for (const auto& s : spans)
      std::memcpy(static_cast<uint8_t*>(s.device->raw()) + s.device_offset, data_ + s.host_offset, s.bytes);
  }

  uint64_t bytes_;
  uint8_t* data_ = nullptr;
  std::vector<std::vector<HostCopySpan>> pending_;  // per layer: copies not yet waited (from_host_layers)
};

}  // namespace

Result<std::unique_ptr<HostCopyEngine>> make_host_copy_engine(Backend& be, uint64_t host_bytes) {
  if (be.device().type == DeviceType::kCPU) {
    auto e = std::make_unique<CpuHostCopyEngine>(host_bytes);
    MX_RETURN_IF_ERROR(e->init());
    return std::unique_ptr<HostCopyEngine>(std::move(e));
  }
#ifdef MXSERVE_HAVE_CUDA
  if (be.device().type == DeviceType::kCUDA) return make_cuda_host_copy_engine(be, host_bytes);
#endif
  return unsupported("backend " + be.name() + " has no host copies (--kv-cache-host-memory)");
}

}  // namespace mxserve::backend
