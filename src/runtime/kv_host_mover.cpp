#include "runtime/kv_host_mover.h"

#include <string>
#include <vector>

#include "backend/host_copy.h"
#include "core/logging.h"

namespace mxserve::runtime {

Status check_host_tier_roles(const kvcache::KvCacheSpec& spec) {
  for (int64_t l = 0; l < spec.n_layers(); ++l)
    for (const auto& t : spec.layers[l].tensors) {
      switch (t.role) {
        case kvcache::CacheRole::kKey:
        case kvcache::CacheRole::kValue:
        case kvcache::CacheRole::kLatent:
        case kvcache::CacheRole::kIndexerKey:
          break;
        default:
          return unsupported("--kv-cache-host-memory: cached layer " + std::to_string(l) + " has a '" +
                             kvcache::cache_role_name(t.role) +
                             "' tensor the host KV tier does not know how to carry; run without the host tier");
      }
    }
  return Status::ok();
}

namespace {

class KvHostMover final : public kvcache::BlockMover {
 public:
  KvHostMover(std::unique_ptr<backend::HostCopyEngine> engine, std::vector<Tensor*> tensors, int64_t block_size,
              uint64_t bytes_per_block)
      : engine_(std::move(engine)), tensors_(std::move(tensors)), block_size_(block_size), bpb_(bytes_per_block) {}
  Status to_host(std::span<const int32_t> dev, std::span<const int32_t> host) override {
    return engine_->to_host(spans(dev, host));
  }
  Status from_host(std::span<const int32_t> host, std::span<const int32_t> dev) override {
    return engine_->from_host(spans(dev, host));
  }

 private:
  std::vector<backend::HostCopySpan> spans(std::span<const int32_t> dev, std::span<const int32_t> host) const {
    std::vector<backend::HostCopySpan> out;
    out.reserve(dev.size() * tensors_.size());
    for (size_t i = 0; i < dev.size() && i < host.size(); ++i) {
      uint64_t host_offset = static_cast<uint64_t>(host[i]) * bpb_;
      for (const Tensor* t : tensors_) {
        const uint64_t row = t->nbytes() / static_cast<uint64_t>(t->dim(0));
        const uint64_t bytes = row * static_cast<uint64_t>(block_size_);
        out.push_back({t, static_cast<uint64_t>(dev[i]) * bytes, host_offset, bytes});
        host_offset += bytes;
      }
    }
    return out;
  }

  std::unique_ptr<backend::HostCopyEngine> engine_;
  std::vector<Tensor*> tensors_;
  int64_t block_size_;
  uint64_t bpb_;
};

}  // namespace

Result<std::unique_ptr<kvcache::BlockMover>> make_kv_host_mover(backend::Backend& be, kvcache::KvCache& kv,
                                                                int64_t n_slots) {
  const kvcache::KvCacheSpec& spec = kv.spec();
  MX_RETURN_IF_ERROR(check_host_tier_roles(spec));
  std::vector<Tensor*> tensors = kv.all_tensors();
  uint64_t per_block = 0;
  for (const Tensor* t : tensors) {
    if (t->ndim() != 2 || t->dim(0) != spec.n_slots() || !t->is_contiguous())
      return internal_error("host KV tier: cache tensor " + t->describe() + " is not [n_slots = " +
                            std::to_string(spec.n_slots()) + ", width] contiguous");
    per_block += t->nbytes() / static_cast<uint64_t>(spec.n_slots()) * static_cast<uint64_t>(spec.block_size);
  }
  if (per_block != spec.bytes_per_block())
    return internal_error("host KV tier: the cache's " + std::to_string(tensors.size()) + " tensors hold " +
                          std::to_string(per_block) + " bytes per block, the layout declares " +
                          std::to_string(spec.bytes_per_block()) + ": a tensor would be left behind");
  MX_ASSIGN_OR_RETURN(std::unique_ptr<backend::HostCopyEngine> engine,
                      backend::make_host_copy_engine(be, per_block * static_cast<uint64_t>(n_slots)));
  MX_LOG(kInfo) << "host KV tier: " << n_slots << " blocks x " << per_block << " bytes ("
                << tensors.size() << " cache tensors over " << spec.n_layers() << " cached layers) in "
                << (engine->pinned() ? "pinned" : "plain") << " host memory";
  return std::unique_ptr<kvcache::BlockMover>(
      std::make_unique<KvHostMover>(std::move(engine), std::move(tensors), spec.block_size, per_block));
}

}  // namespace mxserve::runtime
