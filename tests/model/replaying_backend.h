// Test double: the CPU reference backend with "graphs" -- capture_graph runs the body once (the warm-up) and
// keeps it; replay() runs it again. What a real capture forbids is refused here too: a host<->device copy
// (upload, to_host, write_from_host) or a synchronize inside a body fails the test naming the op, so a body
// that would read a stale host staging buffer on CUDA fails on the CPU. Lets the decode / verify / MTP graphs'
// runtime side (covers, input layout, padded rows, the staged MTP chain state) run in the CPU suite.
// Every op forwards to the wrapped backend (and its MLA / DSA ops).
// run_short_after(n): captures after the n-th fail out of memory (as CUDA's instantiation on a full device, or
// under backend/graph_memory_floor.h), for the graph runtime's keep-what-fits path (runtime/decode_graphs.h).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/mla_dsa_ops.h"
#include "forwarding_backend.h"

namespace mxserve::test {

class ReplayingBackend final : public ForwardingMlaBackend {
 public:
  explicit ReplayingBackend(std::unique_ptr<backend::Backend> inner)
      : ForwardingMlaBackend(std::move(inner)) {}

  int64_t bodies_run() const { return bodies_run_; }

  void run_short_after(int64_t captures) { captures_left_ = captures; }
  int64_t captures() const { return captures_; }
  int64_t pool_releases() const { return pool_releases_; }
  void release_graph_pool() override { ++pool_releases_; }

  Result<std::unique_ptr<backend::DeviceGraph>> capture_graph(const std::function<void()>& body) override {
    if (captures_left_ == 0) return out_of_memory("test: the device has no room for another graph");
    if (captures_left_ > 0) --captures_left_;
    ++captures_;
    run_body(body);  // the warm-up pass; the "capture" keeps the body
    return std::unique_ptr<backend::DeviceGraph>(new Graph(this, body));
  }

  std::string name() const override { return "replaying-" + inner_->name(); }
  Tensor upload(const Tensor& host) override {
    refuse("upload");
    return inner_->upload(host);
  }
  Tensor to_host(const Tensor& t) override {
    refuse("to_host");
    return inner_->to_host(t);
  }
  void write_from_host(Tensor& dst, int64_t offset, const Tensor& host) override {
    refuse("write_from_host");
    inner_->write_from_host(dst, offset, host);
  }
  void synchronize() override {
    refuse("synchronize");
    inner_->synchronize();
  }

 private:
  class Graph final : public backend::DeviceGraph {
   public:
    Graph(ReplayingBackend* be, std::function<void()> body) : be_(be), body_(std::move(body)) {}
    void replay() override { be_->run_body(body_); }

   private:
    ReplayingBackend* be_;
    std::function<void()> body_;
  };
  void run_body(const std::function<void()>& body) {
    in_body_ = true;
    body();
    in_body_ = false;
    ++bodies_run_;
  }
  void refuse(const char* op) const {
    if (in_body_) ADD_FAILURE() << "ReplayingBackend: " << op << " inside a graph body (a real capture refuses it)";
  }

  bool in_body_ = false;
  int64_t bodies_run_ = 0;
  int64_t captures_left_ = -1;  // -1: no limit
  int64_t captures_ = 0;
  int64_t pool_releases_ = 0;
};

}  // namespace mxserve::test
