// HostCopyEngine: byte copies between device tensors and one host buffer owned by the engine -- the
// transport of the host-memory KV tier (kvcache/host_tier.h). CPU backend: a plain 64-byte-aligned host
// buffer and memcpy. CUDA backend: page-locked (cudaHostAlloc) memory and cudaMemcpyAsync on a side stream
// of its own, ordered against the backend's compute stream by events in both directions: a copy starts after
// every kernel enqueued before the call (so it reads final KV), and kernels enqueued after the call start
// after the copy (so a freed block is not overwritten before it is read, and a loaded block is complete
// before attention reads it). The host thread never waits, except in synchronize().
// Kept out of backend.h on purpose: that header is included by every CUDA translation unit.
// Invariant: copies on one engine run in call order (one stream), so a host range written by to_host and
// read back by from_host (or rewritten by a later to_host) is always seen in call order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::backend {

// One contiguous byte range of a device tensor and where it sits in the host buffer.
struct HostCopySpan {
  const Tensor* device = nullptr;  // contiguous, on the engine's backend
  uint64_t device_offset = 0;      // bytes into *device
  uint64_t host_offset = 0;        // bytes into the host buffer
  uint64_t bytes = 0;
};

class HostCopyEngine {
 public:
  virtual ~HostCopyEngine() = default;
  virtual uint64_t host_bytes() const = 0;
  virtual bool pinned() const = 0;  // page-locked host memory (CUDA)
  virtual uint8_t* host_data() = 0;  // the buffer (read it only after synchronize())
  // Device -> host, then host -> device; both validate every span's bounds (an error names the span).
  virtual Status to_host(const std::vector<HostCopySpan>& spans) = 0;
  virtual Status from_host(const std::vector<HostCopySpan>& spans) = 0;
  // Host -> device by layer, overlapped with compute (the host KV tier's per-layer loads): every span of
  // every layer is checked first (an error names the layer and span, nothing is copied); then CUDA enqueues
  // layers[0]'s copies, layers[1]'s, ... on the side stream (after the compute stream's earlier work), each
  // layer's followed by an event of its own, and the CPU keeps them. Unlike from_host, later compute is NOT
  // ordered after them: wait_layer(i) does that for layer i (CUDA: the compute stream waits on layer i's
  // event, no host sync; CPU: layer i's memcpys now). Repeated calls accumulate (layer i's wait covers every
  // call's layer i). to_host, from_host and synchronize first complete every layer not yet waited (call order).
  virtual Status from_host_layers(const std::vector<std::vector<HostCopySpan>>& layers) = 0;
  virtual Status wait_layer(size_t layer) = 0;
  // wait_layer for every layer with copies not yet waited.
  virtual Status wait_all_layers() = 0;
  // Waits until every copy enqueued so far has finished.
  virtual void synchronize() = 0;
};

// A copy engine of host_bytes on be (CPU or CUDA), or a Status naming why not (allocation failure, a
// backend without host copies).
Result<std::unique_ptr<HostCopyEngine>> make_host_copy_engine(Backend& be, uint64_t host_bytes);

// Shared by the implementations: every span inside its tensor and the host buffer.
Status check_host_copy_spans(const std::vector<HostCopySpan>& spans, uint64_t host_bytes, const char* direction);

}  // namespace mxserve::backend
