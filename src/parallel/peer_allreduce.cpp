#include "parallel/peer_allreduce.h"

#include <atomic>
#include <cuda_runtime.h>

#include "core/logging.h"
#include "kernels/cuda/allreduce/peer_allreduce.h"

namespace mxserve::parallel {

namespace kc = kernels::cuda;

namespace {

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

std::string bytes_str(uint64_t b) {
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

}  // namespace

const char* fused_path_name(FusedPath p) {
  switch (p) {
    case FusedPath::kLocal: return "local add+RMSNorm";
    case FusedPath::kOneShot: return "one-shot peer all-reduce";
    case FusedPath::kTwoShot: return "two-shot peer all-reduce";
    case FusedPath::kNccl: return "NCCL all-reduce + add+RMSNorm";
  }
  return "?";
}

// Every rank's device memory: staging buffers (2 x capacity: input half, result half), flag words, epoch
// counters and the error word. Freed when the last handle goes.
class PeerAllReduceGroup {
 public:
  PeerAllReduceOptions options;
  std::vector<int> devices;
  std::vector<void*> buffers;
  std::vector<uint32_t*> flags, counters;
  std::vector<int*> errors;
  std::atomic<bool> logged[4] = {};

  ~PeerAllReduceGroup() {
    for (size_t r = 0; r < devices.size(); ++r) {
      cudaSetDevice(devices[r]);  // teardown: errors are not actionable here
      cudaFree(buffers[r]);
      cudaFree(flags[r]);
      cudaFree(counters[r]);
      cudaFree(errors[r]);
    }
  }
  int world() const { return static_cast<int>(devices.size()); }
  std::string describe() const {
    return "fused all-reduce over " + std::to_string(world()) + " rank(s): one-shot <= " +
           bytes_str(options.one_shot_max_bytes) + ", two-shot <= " + bytes_str(options.capacity_bytes) +
           ", NCCL above";
  }
};

PeerAllReduce::PeerAllReduce(std::shared_ptr<PeerAllReduceGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}
PeerAllReduce::~PeerAllReduce() = default;
int PeerAllReduce::world() const { return group_->world(); }

FusedPath PeerAllReduce::path_for(uint64_t bytes) const {
  if (bytes > group_->options.capacity_bytes) return FusedPath::kNccl;
  if (world() == 1) return FusedPath::kLocal;
  if (bytes <= group_->options.one_shot_max_bytes) return FusedPath::kOneShot;
  return FusedPath::kTwoShot;
}

Status PeerAllReduce::allreduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out,
                                            CUstream_st* stream, Communicator* fallback) {
  const int dev = group_->devices[rank_];
  auto on_device = [&](const Tensor& t, const char* name) -> Status {
    if (!t.defined() || t.dtype() != DType::kBF16 || !t.is_contiguous() || t.device() != Device::cuda(dev))
      return invalid_argument(std::string("fused all-reduce: ") + name + " must be a contiguous bf16 tensor on " +
                              Device::cuda(dev).to_string() + ", got " + (t.defined() ? t.describe() : "none"));
    return Status::ok();
  };
  MX_RETURN_IF_ERROR(on_device(x, "x"));
  MX_RETURN_IF_ERROR(on_device(residual, "residual"));
  MX_RETURN_IF_ERROR(on_device(weight, "weight"));
  MX_RETURN_IF_ERROR(on_device(out, "out"));
  if (x.ndim() != 2 || residual.shape() != x.shape() || out.shape() != x.shape() || weight.ndim() != 1 ||
      weight.dim(0) != x.dim(1))
    return invalid_argument("fused all-reduce: x " + x.describe() + ", residual " + residual.describe() + ", out " +
                            out.describe() + " must be the same [R, C] and weight " + weight.describe() + " [C]");
  if (out.raw() == residual.raw() || out.raw() == x.raw())
    return invalid_argument("fused all-reduce: out must not alias residual or x");
  const uint64_t bytes = x.nbytes();
  const FusedPath path = path_for(bytes);
  if (!group_->logged[static_cast<int>(path)].exchange(true)) {
    if (path == FusedPath::kNccl)
      MX_LOG(kWarn) << "fused all-reduce: " << bytes_str(bytes) << " is above the peer buffers' "
                    << bytes_str(group_->options.capacity_bytes) << ": NCCL all-reduce then a separate add+RMSNorm "
                    << "(slower; raise PeerAllReduceOptions::capacity_bytes to keep it fused)";
    else
      MX_LOG(kInfo) << group_->describe() << ": first " << fused_path_name(path) << " (" << bytes_str(bytes) << ")";
  }
  kc::PeerAllReduceArgs a;
  a.world = world();
  a.rank = rank_;
  a.x = x.raw();
  for (int r = 0; r < world(); ++r) {
    a.buffers[r] = group_->buffers[r];
    a.flags[r] = group_->flags[r];
  }
  a.counters = group_->counters[rank_];
  a.error = group_->errors[rank_];
  a.capacity_bytes = group_->options.capacity_bytes;
  a.residual = residual.raw();
  a.weight = weight.raw();
  a.out = out.raw();
  a.rows = x.dim(0);
  a.cols = x.dim(1);
  a.eps = eps;
  kc::PeerAlgo algo = kc::PeerAlgo::kLocal;
  int blocks = static_cast<int>(std::min<int64_t>(group_->options.max_blocks, std::max<int64_t>(1, a.rows)));
  if (path == FusedPath::kNccl) {
    if (fallback == nullptr)
      return invalid_argument("fused all-reduce: " + bytes_str(bytes) + " is above the peer buffers' " +
                              bytes_str(group_->options.capacity_bytes) + " and no NCCL communicator was given");
    MX_RETURN_IF_ERROR(fallback->all_reduce(x, ReduceOp::kSum));
    a.world = 1;
    blocks = std::min<int>(kc::kPeerMaxBlocks, static_cast<int>(std::min<int64_t>(a.rows, 1024)));
  } else if (path == FusedPath::kLocal) {
    blocks = std::min<int>(kc::kPeerMaxBlocks, static_cast<int>(std::min<int64_t>(a.rows, 1024)));
  } else {
    algo = path == FusedPath::kOneShot ? kc::PeerAlgo::kOneShot : kc::PeerAlgo::kTwoShot;
    if (algo == kc::PeerAlgo::kTwoShot) {
      const int64_t slice = (a.rows + a.world - 1) / a.world;
      blocks = static_cast<int>(std::min<int64_t>(group_->options.max_blocks, std::max<int64_t>(1, slice)));
    }
  }
  const cudaError_t e = kc::launch_peer_allreduce_rmsnorm(a, algo, blocks, stream);
  if (e != cudaSuccess) return internal_error(cuda_error("fused all-reduce launch", e));
  return Status::ok();
}

Status PeerAllReduce::check(CUstream_st* stream) {
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return internal_error(cuda_error("fused all-reduce", e));
  int err = 0;
  e = cudaMemcpy(&err, group_->errors[rank_], sizeof(int), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return internal_error(cuda_error("fused all-reduce: reading the error word", e));
  if (err != 0)
    return unavailable("fused all-reduce on rank " + std::to_string(rank_) + " of " + std::to_string(world()) +
                       ": a peer barrier waited ~10 s for another rank and gave up (a rank stopped calling, or the "
                       "ranks' kernels were not resident at once)");
  return Status::ok();
}

Result<std::vector<std::unique_ptr<PeerAllReduce>>> make_peer_allreduce_group(const std::vector<int>& devices,
                                                                              const PeerAllReduceOptions& options) {
  const int n = static_cast<int>(devices.size());
  if (n < 1 || n > kc::kPeerMaxRanks)
    return invalid_argument("fused all-reduce: " + std::to_string(n) + " ranks (1.." +
                            std::to_string(kc::kPeerMaxRanks) + " on one node)");
  if (options.max_blocks < 1 || options.max_blocks > kc::kPeerMaxBlocks)
    return invalid_argument("fused all-reduce: max_blocks " + std::to_string(options.max_blocks) + " (1.." +
                            std::to_string(kc::kPeerMaxBlocks) + ")");
  if (options.capacity_bytes % 16 != 0 || options.capacity_bytes == 0)
    return invalid_argument("fused all-reduce: capacity_bytes " + std::to_string(options.capacity_bytes) +
                            " must be a positive multiple of 16");
  auto group = std::make_shared<PeerAllReduceGroup>();
  group->options = options;
  for (int r = 0; r < n; ++r) {
    const int dev = devices[r];
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) return unavailable(cuda_error(("fused all-reduce: rank " + std::to_string(r) + " device " + std::to_string(dev)).c_str(), e));
    group->devices.push_back(dev);
    group->buffers.push_back(nullptr);
    group->flags.push_back(nullptr);
    group->counters.push_back(nullptr);
    group->errors.push_back(nullptr);
    e = cudaMalloc(&group->buffers[r], 2 * options.capacity_bytes);
    if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&group->flags[r]), kc::kPeerFlagWords * sizeof(uint32_t));
    if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&group->counters[r]), kc::kPeerMaxBlocks * sizeof(uint32_t));
    if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&group->errors[r]), sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(group->flags[r], 0, kc::kPeerFlagWords * sizeof(uint32_t));
    if (e == cudaSuccess) e = cudaMemset(group->counters[r], 0, kc::kPeerMaxBlocks * sizeof(uint32_t));
    if (e == cudaSuccess) e = cudaMemset(group->errors[r], 0, sizeof(int));
    if (e == cudaSuccess) e = cudaDeviceSynchronize();  // the backends' streams do not wait for the null stream
    if (e != cudaSuccess)
      return out_of_memory(cuda_error(("fused all-reduce: rank " + std::to_string(r) + " staging buffers (2 x " +
                                       bytes_str(options.capacity_bytes) + ") on device " + std::to_string(dev)).c_str(), e));
  }
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p) {
      if (devices[r] == devices[p]) continue;
      int can = 0;
      cudaDeviceCanAccessPeer(&can, devices[r], devices[p]);
      if (!can)
        return unsupported("fused all-reduce: device " + std::to_string(devices[r]) + " cannot access device " +
                           std::to_string(devices[p]) + "'s memory (no peer access: NVLink or PCIe P2P); run without "
                           "the fused all-reduce (NCCL)");
      cudaSetDevice(devices[r]);
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[p], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clears the sticky-free "already enabled" error
      } else if (e != cudaSuccess) {
        return unavailable(cuda_error(("fused all-reduce: enabling peer access " + std::to_string(devices[r]) + " -> " +
                                       std::to_string(devices[p])).c_str(), e));
      }
    }
  MX_LOG(kInfo) << group->describe();
  std::vector<std::unique_ptr<PeerAllReduce>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<PeerAllReduce>(group, r));
  return out;
}

}  // namespace mxserve::parallel
