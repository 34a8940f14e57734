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

std::string block_list(std::span<const int32_t> blocks) {
  std::string out;
  for (size_t i = 0; i < blocks.size() && i < 8; ++i) out += (i ? ", " : "") + std::to_string(blocks[i]);
  if (blocks.size() > 8) out += ", ... (" + std::to_string(blocks.size()) + " blocks)";
  return out;
}

}  // namespace

KvHostMover::KvHostMover(kvcache::KvCache& kv, std::unique_ptr<backend::HostCopyEngine> engine,
                         std::vector<Part> parts, int64_t n_slots)
    : kv_(kv), engine_(std::move(engine)), parts_(std::move(parts)), n_slots_(n_slots),
      n_layers_(kv.spec().n_layers()), n_blocks_(kv.spec().n_blocks), bytes_per_block_(kv.spec().bytes_per_block()),
      layer_pending_(static_cast<size_t>(kv.spec().n_layers()), false) {}

KvHostMover::~KvHostMover() {
  if (kv_.load_gate() == this) kv_.set_load_gate(nullptr);
}

Status KvHostMover::to_host(std::span<const int32_t> dev, std::span<const int32_t> host) {
  MX_RETURN_IF_ERROR(settle());  // call order: a load still reading a host slot comes before its rewrite
  std::vector<backend::HostCopySpan> spans;
  spans.reserve(dev.size() * parts_.size());
  for (size_t i = 0; i < dev.size() && i < host.size(); ++i)
    for (const Part& p : parts_)
      spans.push_back({p.tensor, static_cast<uint64_t>(dev[i]) * p.bytes_per_block,
                       static_cast<uint64_t>(host[i]) * bytes_per_block_ + p.slot_offset, p.bytes_per_block});
  return engine_->to_host(spans);
}

Status KvHostMover::from_host(std::span<const int32_t> host, std::span<const int32_t> dev) {
  if (host.size() != dev.size())
    return invalid_argument("host KV tier: loading " + std::to_string(host.size()) + " host slots into " +
                            std::to_string(dev.size()) + " device blocks");
  for (size_t i = 0; i < dev.size(); ++i) {
    const std::string what = "host KV tier: loading host slot " + std::to_string(host[i]) + " into device block " +
                             std::to_string(dev[i]) + ": ";
    if (host[i] < 0 || host[i] >= n_slots_)
      return invalid_argument(what + "the slot lies outside the tier's " + std::to_string(n_slots_) + " slots");
    if (dev[i] < 0 || dev[i] >= n_blocks_)
      return invalid_argument(what + "the block lies outside the cache's " + std::to_string(n_blocks_) + " blocks");
  }
  if (dev.empty()) return Status::ok();
  std::vector<std::vector<backend::HostCopySpan>> layers(static_cast<size_t>(n_layers_));
  for (size_t i = 0; i < dev.size(); ++i)
    for (const Part& p : parts_)
      layers[p.layer].push_back({p.tensor, static_cast<uint64_t>(dev[i]) * p.bytes_per_block,
                                 static_cast<uint64_t>(host[i]) * bytes_per_block_ + p.slot_offset,
                                 p.bytes_per_block});
  const Status st = engine_->from_host_layers(layers);
  if (!st.is_ok())
    return Status(st.code(), "host KV tier: loading device blocks [" + block_list(dev) + "]: " + st.message());
  for (int32_t b : dev) targets_.insert(b);
  for (int64_t l = 0; l < n_layers_; ++l) layer_pending_[l] = layer_pending_[l] || !layers[l].empty();
  kv_.set_load_gate(this);
  return per_layer_ ? Status::ok() : settle();
}

Status KvHostMover::wait(int64_t layer) {
  if (layer < 0 || layer >= n_layers_)
    return invalid_argument("host KV tier: a forward waited for cached layer " + std::to_string(layer) +
                            " of a cache of " + std::to_string(n_layers_) + " layers");
  if (!layer_pending_[layer]) return Status::ok();
  layer_pending_[layer] = false;
  const Status st = engine_->wait_layer(static_cast<size_t>(layer));
  if (!st.is_ok()) {
    std::vector<int32_t> blocks(targets_.begin(), targets_.end());
    return Status(st.code(), "host KV tier: the loads of cached layer " + std::to_string(layer) + " into blocks [" +
                                 block_list(blocks) + "]: " + st.message());
  }
  for (bool p : layer_pending_)
    if (p) return Status::ok();
  targets_.clear();
  kv_.set_load_gate(nullptr);  // nothing in flight: later forwards pay nothing
  return Status::ok();
}

Status KvHostMover::settle() {
  for (int64_t l = 0; l < n_layers_; ++l) MX_RETURN_IF_ERROR(wait(l));
  return Status::ok();
}

Status KvHostMover::before_free(std::span<const int32_t> dev) {
  for (int32_t b : dev)
    if (targets_.count(b)) return settle();
  return Status::ok();
}

Result<std::unique_ptr<KvHostMover>> KvHostMover::make(backend::Backend& be, kvcache::KvCache& kv, int64_t n_slots) {
  const kvcache::KvCacheSpec& spec = kv.spec();
  MX_RETURN_IF_ERROR(check_host_tier_roles(spec));
  if (n_slots <= 0) return invalid_argument("host KV tier: " + std::to_string(n_slots) + " slots");
  // Which cached layer each tensor of all_tensors() belongs to (the per-layer loads group by it).
  std::vector<std::pair<const Tensor*, int64_t>> owner;
  for (int64_t l = 0; l < spec.n_layers(); ++l)
    for (const auto& t : spec.layers[l].tensors) {
      owner.push_back({&kv.tensor(l, t.role), l});
      if (const Tensor* sc = kv.scales_if_any(l, t.role)) owner.push_back({sc, l});
    }
  std::vector<Part> parts;
  uint64_t per_block = 0;
  for (Tensor* t : kv.all_tensors()) {
    if (t->ndim() != 2 || t->dim(0) != spec.n_slots() || !t->is_contiguous())
      return internal_error("host KV tier: cache tensor " + t->describe() + " is not [n_slots = " +
                            std::to_string(spec.n_slots()) + ", width] contiguous");
    int64_t layer = -1;
    for (const auto& [p, l] : owner)
      if (p == t) layer = l;
    if (layer < 0) return internal_error("host KV tier: cache tensor " + t->describe() + " belongs to no cached layer");
    const uint64_t bytes = t->nbytes() / static_cast<uint64_t>(spec.n_slots()) * static_cast<uint64_t>(spec.block_size);
    parts.push_back({t, layer, per_block, bytes});
    per_block += bytes;
  }
  if (per_block != spec.bytes_per_block())
    return internal_error("host KV tier: the cache's " + std::to_string(parts.size()) + " tensors hold " +
                          std::to_string(per_block) + " bytes per block, the layout declares " +
                          std::to_string(spec.bytes_per_block()) + ": a tensor would be left behind");
  MX_ASSIGN_OR_RETURN(std::unique_ptr<backend::HostCopyEngine> engine,
                      backend::make_host_copy_engine(be, per_block * static_cast<uint64_t>(n_slots)));
  MX_LOG(kInfo) << "host KV tier: " << n_slots << " blocks x " << per_block << " bytes (" << parts.size()
                << " cache tensors over " << spec.n_layers() << " cached layers) in "
                << (engine->pinned() ? "pinned" : "plain") << " host memory; loads go layer by layer, "
                << "overlapped with the forward";
  return std::unique_ptr<KvHostMover>(new KvHostMover(kv, std::move(engine), std::move(parts), n_slots));
}

}  // namespace mxserve::runtime
