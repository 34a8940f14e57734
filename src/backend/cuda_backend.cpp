// The CUDA backend: bf16 activations and weights on one GPU and one stream; fp32 accumulation in every
// kernel; the router and logits in f32; a paged bf16 KV cache. Each op validates dtypes and shapes once
// at its entry and fails loudly (naming the op and tensors) on anything it does not implement -- no
// fallback to another backend. Device memory comes from a caching allocator (no cudaMalloc per op).
// Owns: the stream, the allocator, the cuBLASLt plans. Does not own: any kernel code (kernels/cuda).
#include "backend/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "backend/cuda_mla_dsa_ops.h"
#include "backend/device_memory.h"
#include "backend/graph_memory_floor.h"
#include "core/check.h"
#include "core/device_oom.h"
#include "core/logging.h"
#include "core/numeric.h"
#include "kernels/cuda/common/caching_allocator.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/add_rmsnorm.h"
#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/attention/cascade_attention.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm/cublaslt_gemm.h"
#include "kernels/cuda/moe/moe_expert_range.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_pd.h"
#include "kernels/cuda/moe_mxfp4/moe_prefill_dequant.h"
#include "kernels/cuda/rope_kv_write.h"
#include "kernels/cuda/sampling/argmax.h"
#include "kernels/cuda/sampling/sample_rows.h"
#include "kernels/cuda/synthetic_fill.h"
#include "kernels/moe_plan.h"
#include "kernels/attention_tuning.h"
#include "kernels/moe_tuning.h"

namespace mxserve::backend {
namespace {

namespace kc = kernels::cuda;

void expect(const Tensor& t, DType dt, const char* op, const char* what) {
  MX_CHECK_MSG(t.dtype() == dt, "cuda " << op << ": " << what << " is " << t.describe() << ", expected "
                                        << dtype_name(dt) << " (not implemented on the CUDA backend)");
  MX_CHECK_MSG(t.device().type == DeviceType::kCUDA || t.numel() == 0,
               "cuda " << op << ": " << what << " is on " << t.device().to_string());
  MX_CHECK_MSG(t.is_contiguous(), "cuda " << op << ": " << what << " is not contiguous");
}

// An FP8 KV op: e4m3 caches of the params' width on this device, and both scale pointers.
void expect_fp8_cache(const Tensor& k_cache, const Tensor& v_cache, const kernels::AttentionParams& p, const char* op) {
  expect(k_cache, DType::kFP8E4M3, op, "k_cache");
  expect(v_cache, DType::kFP8E4M3, op, "v_cache");
  const int64_t width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  MX_CHECK_MSG(k_cache.dim(1) == width && v_cache.dim(1) == width,
               "cuda " << op << ": FP8 caches " << k_cache.describe() << " / " << v_cache.describe() << ", expected width "
                       << width);
  MX_CHECK_MSG(p.v_scales != nullptr, "cuda " << op << ": FP8 KV cache with k_scales but no v_scales");
}

// The routed-expert shape of one moe_experts call: T = x rows, d_model = x columns, top_k = ids columns.
kc::MoeShape routed_shape(const Tensor& x, const Tensor& topk_ids, int64_t n_experts, int64_t inter) {
  kc::MoeShape s;
  s.n_tokens = x.dim(0);
  s.d_model = x.dim(1);
  s.top_k = static_cast<int32_t>(topk_ids.dim(1));
  s.n_experts = static_cast<int32_t>(n_experts);
  s.inter = inter;
  return s;
}

// The kernels' variant list as the planner sees it (kernels/moe_plan.h; gemm 0 = gate_up, 1 = down).
kernels::MoeVariantCatalog mxfp4_catalog() {
  kernels::MoeVariantCatalog c;
  c.index = [](int gemm, const std::string& name) {
    return kc::moe_mxfp4_variant_index(static_cast<kc::MoeGemm>(gemm), name);
  };
  c.max_tokens = [](int gemm, int variant, const kernels::MoeTuningKey& k) {
    kc::MoeShape s;
    s.d_model = k.hidden;
    s.inter = k.inter;
    s.n_experts = static_cast<int32_t>(k.experts);
    s.top_k = static_cast<int32_t>(k.top_k);
    return kc::moe_mxfp4_variant_max_tokens(static_cast<kc::MoeGemm>(gemm), variant, s);
  };
  return c;
}

// A captured graph; holds the graph-private pool its temporaries live in.
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream, std::shared_ptr<kc::PrivatePool> pool)
      : exec_(exec), stream_(stream), pool_(std::move(pool)) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }  // teardown: errors are not actionable here
  void replay() override { MX_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }
  // cuda_graph_try_replay: the launch's error as a Status (a rank's replay failing fails its step, no crash).
  Status try_replay() {
    const cudaError_t e = cudaGraphLaunch(exec_, stream_);
    if (e == cudaSuccess) return Status::ok();
    (void)cudaGetLastError();
    return internal_error(std::string("cudaGraphLaunch: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  std::shared_ptr<kc::PrivatePool> pool_;
};

class CudaBackend final : public Backend, public CudaMlaDsaOps {  // + the MLA / DSA ops
 public:
  explicit CudaBackend(int device) : device_(device) {
    MX_CUDA_CHECK(cudaSetDevice(device_));
    MX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MX_CUDA_CHECK(cudaDeviceGetAttribute(&n_sms_, cudaDevAttrMultiProcessorCount, device_));
    pool_ = kc::CachingAllocator::create(device_);
    gemm_ = std::make_unique<kc::LtGemm>(stream_);
    init_mla_dsa(this, stream_);
    cudaDeviceProp prop{};
    MX_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    gpu_name_ = prop.name;
    moe_planner_ = std::make_unique<kernels::MoeKernelPlanner>(&kernels::global_moe_tuning(),
                                                               &kernels::global_moe_tuning_mutex(), mxfp4_catalog());
  }

  // Every variant name in the loaded tables must be compiled into this binary (an error names the table file).
  Status validate_moe_tables() {
    std::lock_guard<std::mutex> lock(kernels::global_moe_tuning_mutex());
    return kernels::validate_moe_tuning(kernels::global_moe_tuning(), mxfp4_catalog().index);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);  // teardown: let queued work finish before handles go
    if (staging_ != nullptr) cudaFreeHost(staging_);
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(device_); }
  DType activation_dtype() const override { return DType::kBF16; }
  DType weight_dtype() const override { return DType::kBF16; }
  bool supports_expert_format(ExpertFormat f) const override {
    return f == ExpertFormat::kFloat || f == ExpertFormat::kMxfp4;
  }
  void prepare_moe(ExpertWeights& ex, int64_t top_k) override {
    if (ex.format == ExpertFormat::kMxfp4) ex.kernel_plan = &moe_planner_->prepare(moe_key(ex, top_k));
  }
  std::vector<kernels::MoeKernelConfigRow> moe_kernel_configs() const override { return moe_planner_->rows(); }

  int64_t cascade_attention_min_saved_bytes() const override {
    return cascade_attention_ ? cascade_min_saved_bytes_ : -1;
  }
  Status set_kernel_options(const KernelOptions& o) override {
    using Force = kc::AttentionPlanOptions::Force;
    kc::AttentionPlanOptions a;
    if (o.attention_kernel == "simt") a.force = Force::kSimt;
    else if (o.attention_kernel == "warp") a.force = Force::kWarp;
    else if (o.attention_kernel == "shared") a.force = Force::kShared;
    else if (o.attention_kernel == "wgmma_ws") a.force = Force::kWgmmaWs;
    else if (o.attention_kernel == "wgmma")  // issue 31 retired the first wgmma kernel (auto ran wgmma_ws)
      return invalid_argument("attention kernel 'wgmma' was retired: the Hopper prefill kernel is 'wgmma_ws'");
    else if (!o.attention_kernel.empty())
      return invalid_argument("attention kernel '" + o.attention_kernel +
                              "': expected simt, warp, shared or wgmma_ws");
    if (o.attention_split_target < 0)
      return invalid_argument("attention split target " + std::to_string(o.attention_split_target) + " must be >= 0");
    if (!o.moe_kernel.empty() && o.moe_kernel != "grouped" && o.moe_kernel != "prefill_dequant")
      return invalid_argument("moe kernel '" + o.moe_kernel +
                              "': expected grouped, prefill_dequant (or empty: by token count)");
    if (!o.moe_activation_dtype.empty() && o.moe_activation_dtype != "bf16" && !o.fp8_moe_activations())
      return invalid_argument("moe activation dtype '" + o.moe_activation_dtype + "': expected bf16 or fp8_e4m3");
    if (o.attention_fp8_prefill == "fused") a.fp8_prefill = kc::AttentionPlanOptions::Fp8Prefill::kFused;
    else if (!o.attention_fp8_prefill.empty())
      return invalid_argument("attention fp8 prefill '" + o.attention_fp8_prefill +
                              "': expected fused (or empty: dequantize once where the scratch holds the step)");
    a.warp_split_target_per_sm = o.attention_split_target;
    attention_options_ = a;
    if (o.cascade_min_saved_bytes < 0)
      return invalid_argument("cascade_min_saved_bytes " + std::to_string(o.cascade_min_saved_bytes) + " must be >= 0");
    cascade_attention_ = o.cascade_attention;
    cascade_min_saved_bytes_ = o.cascade_min_saved_bytes;
    force_grouped_moe_ = o.moe_kernel == "grouped";
    prefill_dequant_moe_ = o.moe_kernel == "prefill_dequant";
    if (o.fp8_moe_activations() && !fp8_announced_) {
      fp8_announced_ = true;
      MX_LOG(kInfo) << "MoE activations: fp8_e4m3 (W4A8) on the MXFP4 experts' wgmma prefill GEMMs; decode-sized "
                       "GEMMs and bf16 experts keep bf16 activations";
    }
    fp8_moe_activations_ = o.fp8_moe_activations();
    return Status::ok();
  }

  // ---- memory ----
  Tensor alloc(DType dtype, Shape shape) override {
    auto bytes = dtype_bytes(dtype, static_cast<uint64_t>(shape_numel(shape)));
    MX_CHECK_MSG(bytes.has_value(), "cuda alloc: " << dtype_name(dtype) << shape_to_string(shape));
    return Tensor::from_storage(pool_->allocate(*bytes), dtype, std::move(shape));
  }

  void copy_weight(const Tensor& host, Tensor& dst) override {
    MX_CHECK_MSG(host.numel() == dst.numel(), "cuda copy_weight: " << host.describe() << " into " << dst.describe());
    MX_CHECK_MSG(host.device().type == DeviceType::kCPU && dst.device().type == DeviceType::kCUDA,
                 "cuda copy_weight: host " << host.device().to_string() << " -> " << dst.device().to_string());
    const int64_t n = host.numel();
    const auto* src = static_cast<const uint8_t*>(host.raw());
    auto read = [&](int64_t i) -> float {  // mmap offsets need not be aligned: memcpy each element
      switch (host.dtype()) {
        case DType::kF32: {
          float v;
          std::memcpy(&v, src + 4 * i, 4);
          return v;
        }
        case DType::kBF16: {
          uint16_t v;
          std::memcpy(&v, src + 2 * i, 2);
          return bf16_to_f32(v);
        }
        case DType::kF16: {
          uint16_t v;
          std::memcpy(&v, src + 2 * i, 2);
          return f16_to_f32(v);
        }
        default: MX_CHECK_MSG(false, "cuda copy_weight: unsupported source " << host.describe());
      }
      return 0.f;
    };
    if (dst.dtype() == DType::kBF16 && host.dtype() == DType::kBF16) {
      MX_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), host.raw(), 2 * n, cudaMemcpyHostToDevice, stream_));
      MX_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host tensor may be a temporary
    } else if (dst.dtype() == DType::kBF16) {
      std::vector<uint16_t> staged(n);
      for (int64_t i = 0; i < n; ++i) staged[i] = f32_to_bf16(read(i));
      MX_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), staged.data(), 2 * n, cudaMemcpyHostToDevice, stream_));
      MX_CUDA_CHECK(cudaStreamSynchronize(stream_));  // staged is freed on return
    } else if (dst.dtype() == DType::kF32) {
      std::vector<float> staged(n);
      for (int64_t i = 0; i < n; ++i) staged[i] = read(i);
      MX_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), staged.data(), 4 * n, cudaMemcpyHostToDevice, stream_));
      MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    } else {
      MX_CHECK_MSG(false, "cuda copy_weight: unsupported destination " << dst.describe());
    }
  }

  Tensor upload(const Tensor& host) override {
    no_copy_in_graph("upload");
    MX_CHECK_MSG(host.device().type == DeviceType::kCPU && host.is_contiguous(),
                 "cuda upload: " << host.describe() << " on " << host.device().to_string());
    Tensor t = alloc(host.dtype(), host.shape());
    const size_t n = host.nbytes();
    if (n == 0) return t;
    if (n > kStagingBytes / 4) {
      // Large (rare: weights go through copy_weight): the caller may free the host buffer on return.
      MX_CUDA_CHECK(cudaMemcpyAsync(t.raw(), host.raw(), n, cudaMemcpyHostToDevice, stream_));
      MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return t;
    }
    // Per-step metadata (ids, positions, slots): staged through the pinned ring so the host never waits.
    MX_CUDA_CHECK(cudaMemcpyAsync(t.raw(), stage(host.raw(), n), n, cudaMemcpyHostToDevice, stream_));
    return t;
  }

  // Copies n bytes (<= kStagingBytes / 4) into the pinned staging ring; the ring is reused from its start
  // only after the stream drained (one synchronize per kStagingBytes staged).
  const void* stage(const void* host, size_t n) {
    if (staging_ == nullptr) MX_CUDA_CHECK(cudaHostAlloc(&staging_, kStagingBytes, cudaHostAllocDefault));
    staging_off_ = (staging_off_ + 255) & ~size_t{255};
    if (staging_off_ + n > kStagingBytes) {
      MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
      staging_off_ = 0;
    }
    char* src = static_cast<char*>(staging_) + staging_off_;
    std::memcpy(src, host, n);
    staging_off_ += n;
    return src;
  }

  void write_from_host(Tensor& dst, int64_t offset, const Tensor& host) override {
    no_copy_in_graph("write_from_host");
    MX_CHECK_MSG(host.device().type == DeviceType::kCPU && host.dtype() == dst.dtype() && host.is_contiguous() &&
                     dst.is_contiguous() && offset >= 0 && offset + host.numel() <= dst.numel(),
                 "cuda write_from_host: " << host.describe() << " at " << offset << " into " << dst.describe());
    const size_t n = host.nbytes();
    if (n == 0) return;
    char* to = static_cast<char*>(dst.raw()) + static_cast<size_t>(offset) * (n / host.numel());
    if (n > kStagingBytes / 4) {
      MX_CUDA_CHECK(cudaMemcpyAsync(to, host.raw(), n, cudaMemcpyHostToDevice, stream_));
      MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    MX_CUDA_CHECK(cudaMemcpyAsync(to, stage(host.raw(), n), n, cudaMemcpyHostToDevice, stream_));
  }

  Tensor to_host(const Tensor& t) override {
    no_copy_in_graph("to_host");
    MX_CHECK_MSG(t.is_contiguous(), "cuda to_host: " << t.describe() << " is not contiguous");
    if (t.device().type == DeviceType::kCPU) {
      Tensor h = Tensor::empty(t.dtype(), t.shape());
      std::memcpy(h.raw(), t.raw(), t.nbytes());
      return h;
    }
    Tensor raw = Tensor::empty(t.dtype(), t.shape());
    if (t.nbytes() > 0)
      MX_CUDA_CHECK(cudaMemcpyAsync(raw.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (t.dtype() != DType::kBF16) return raw;  // f32 and integer tensors: exact
    Tensor f = Tensor::empty(DType::kF32, t.shape());
    const auto* s = raw.data<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) f.data<float>()[i] = bf16_to_f32(s[i]);
    return f;
  }

  void synchronize() override {
    no_copy_in_graph("synchronize");
    MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void release_graph_pool() override {
    if (!graph_pool_) return;
    pool_->set_private_pool(nullptr);
    graph_pool_.reset();  // the pool's blocks go back to the driver with its last owner
  }

  // cuda_backend_set_graph_body: this backend's part of a graph another backend captures.
  void set_graph_body(bool on) {
    if (on && !graph_pool_) graph_pool_ = std::make_shared<kc::PrivatePool>();
    pool_->set_private_pool(on ? graph_pool_ : nullptr);
    in_graph_body_ = on;
  }

  Result<std::unique_ptr<DeviceGraph>> capture_graph(const std::function<void()>& body) override {
    return capture_graph_in(body, cudaStreamCaptureModeRelaxed);
  }
  // mode: Relaxed (capture_graph) or ThreadLocal (cuda_backend_capture_graph_thread_local: one capturing thread
  // per GPU, as NCCL asks of graphs holding its collectives).
  Result<std::unique_ptr<DeviceGraph>> capture_graph_in(const std::function<void()>& body, cudaStreamCaptureMode mode) {
    if (!graph_pool_) graph_pool_ = std::make_shared<kc::PrivatePool>();
    pool_->set_private_pool(graph_pool_);
    in_graph_body_ = true;
    auto leave_body = [&] {
      in_graph_body_ = false;
      pool_->set_private_pool(nullptr);
    };
    // warm-up: the private pool learns this body's blocks, so the capture allocates nothing new. A temporary the
    // device cannot hold fails this graph (out of memory), not the process.
    try {
      body();
    } catch (const DeviceOutOfMemory& e) {
      leave_body();
      return out_of_memory(std::string("CUDA graph warm-up: ") + e.what());
    }
    MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MX_CUDA_CHECK(cudaStreamBeginCapture(stream_, mode));
    std::string thrown;
    try {
      body();
    } catch (const DeviceOutOfMemory& e) {
      thrown = e.what();  // the capture is ended below, then the graph dropped
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    leave_body();
    if (!thrown.empty()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      return out_of_memory("CUDA graph capture: " + thrown);
    }
    if (end != cudaSuccess) {
      (void)cudaGetLastError();
      return internal_error(std::string("CUDA graph capture failed: ") + cudaGetErrorString(end));
    }
    cudaGraphExec_t exec = nullptr;
    // Out of the driver's memory: the graph fails, out of memory and named; the graph runtime keeps the graphs it
    // has (runtime/decode_graphs.h) or runs eagerly. The allocators' cached blocks are NOT released to make room:
    // after the start-up dry run they are the forward's activation reserve that the KV budget left
    // (launch/launch_memory.h). Releasing them once let the seed layout's graphs fit at --gpu-memory-utilization
    // 0.9 on an H200 (eight stand-in ranks, 24 GiB released), and then every request failed: cuBLASLt could not
    // launch (status 13) in the first steps (docs/perf/parallel.md, session 13). For the same reason an
    // instantiation that fits but leaves less free than backend/graph_memory_floor.h is undone.
    const cudaError_t inst = instantiate(&exec, graph);
    cudaGraphDestroy(graph);
    const char* room = " (the graphs need device memory outside the KV pool and the activation reserve: lower "
                       "--gpu-memory-utilization or --kv-cache-memory, or --max-num-seqs for fewer graph shapes)";
    if (inst != cudaSuccess) {
      (void)cudaGetLastError();
      const std::string why = std::string("CUDA graph instantiation failed: ") + cudaGetErrorString(inst);
      if (inst == cudaErrorMemoryAllocation) return out_of_memory(why + room);
      return internal_error(why);
    }
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && free_b < graph_memory_floor(total_b)) {
      cudaGraphExecDestroy(exec);
      return out_of_memory("CUDA graph instantiation would leave " + std::to_string(free_b >> 20) +
                           " MiB of device memory free, under the " + std::to_string(graph_memory_floor(total_b) >> 20) +
                           " MiB kept for kernel launches and libraries (backend/graph_memory_floor.h)" + room);
    }
    return std::unique_ptr<DeviceGraph>(std::make_unique<CudaGraph>(exec, stream_, graph_pool_));
  }

  // cudaGraphInstantiate, or the test hook's full device (core/device_oom.h graph_instantiate_fault).
  static cudaError_t instantiate(cudaGraphExec_t* exec, cudaGraph_t graph) {
    if (graph_instantiate_fault::take()) return cudaErrorMemoryAllocation;
    return cudaGraphInstantiate(exec, graph, 0);
  }

  // ---- ops ----
  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    expect(table, DType::kBF16, "embedding", "table");
    expect(ids, DType::kI32, "embedding", "ids");
    expect(out, DType::kBF16, "embedding", "out");
    MX_CHECK_EQ(out.numel(), ids.numel() * table.dim(1));
    kc::gather_rows(table.raw(), ids.data<int32_t>(), out.raw(), ids.numel(), table.dim(1) * 2, stream_);
  }

  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    expect(x, DType::kBF16, "rmsnorm", "x");
    expect(w, DType::kBF16, "rmsnorm", "w");
    expect(out, DType::kBF16, "rmsnorm", "out");
    const int64_t cols = w.numel();
    MX_CHECK_EQ(x.numel() % cols, 0);
    MX_CHECK_EQ(out.numel(), x.numel());
    kc::rmsnorm_bf16(x.raw(), w.raw(), out.raw(), x.numel() / cols, cols, eps, stream_);
  }

  // One kernel (kernels/cuda/add_rmsnorm.h), bit for bit add then rmsnorm; MXSERVE_FUSED_ADD_NORM=0 runs the two.
  void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& w, float eps, Tensor& out) override {
    static const bool fused = [] {
      const char* v = std::getenv("MXSERVE_FUSED_ADD_NORM");
      const bool on = v == nullptr || std::strcmp(v, "0") != 0;
      if (!on) {
        MX_LOG(kWarn) << "MXSERVE_FUSED_ADD_NORM=0: residual add and RMSNorm run as two kernels (one more launch "
                         "and one more pass over the residual per layer half); unset it for the fused kernel";
      }
      return on;
    }();
    if (!fused) return Backend::add_rmsnorm(x, residual, w, eps, out);
    expect(x, DType::kBF16, "add_rmsnorm", "x");
    expect(residual, DType::kBF16, "add_rmsnorm", "residual");
    expect(w, DType::kBF16, "add_rmsnorm", "w");
    expect(out, DType::kBF16, "add_rmsnorm", "out");
    const int64_t cols = w.numel();
    MX_CHECK_MSG(cols > 0 && x.numel() % cols == 0 && residual.numel() == x.numel() && out.numel() == x.numel() &&
                     residual.raw() != out.raw(),
                 "cuda add_rmsnorm: x " << x.describe() << ", residual " << residual.describe() << ", w "
                                        << w.describe() << ", out " << out.describe());
    kc::add_rmsnorm_bf16(x.raw(), residual.raw(), w.raw(), out.raw(), x.numel() / cols, cols, eps, stream_);
  }

  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    expect(x, DType::kBF16, "linear", "x");
    expect(w, DType::kBF16, "linear", "w");
    MX_CHECK_MSG(w.ndim() == 2, "cuda linear: w is " << w.describe());
    MX_CHECK_MSG(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32,
                 "cuda linear: out is " << out.describe() << " (bf16 or f32 implemented)");
    expect(out, out.dtype(), "linear", "out");
    if (bias) expect(*bias, DType::kBF16, "linear", "bias");
    const int64_t n = w.dim(0), k = w.dim(1);
    MX_CHECK_EQ(x.numel() % k, 0);
    const int64_t m = x.numel() / k;
    MX_CHECK_EQ(out.numel(), m * n);
    gemm_->run(x.raw(), w.raw(), bias ? bias->raw() : nullptr, out.raw(), out.dtype() == DType::kF32, m, n, k);
  }

  void rope(Tensor& x, const Tensor& positions, const kernels::RopeParams& p) override {
    expect(x, DType::kBF16, "rope", "x");
    expect(positions, DType::kI32, "rope", "positions");
    MX_CHECK_EQ(x.numel(), positions.numel() * p.n_heads * p.head_dim);
    MX_CHECK_MSG(p.rotary_dim % 2 == 0 && p.rotary_dim <= p.head_dim, "cuda rope: rotary_dim " << p.rotary_dim);
    kc::rope_neox_bf16(x.raw(), positions.data<int32_t>(), positions.numel(), p, stream_);
  }

  void silu_mul(const Tensor& gate_up, Tensor& out) override {
    expect(gate_up, DType::kBF16, "silu_mul", "gate_up");
    expect(out, DType::kBF16, "silu_mul", "out");
    const int64_t inter = out.dim(-1);
    MX_CHECK_EQ(gate_up.numel(), 2 * out.numel());
    kc::silu_mul_bf16(gate_up.raw(), out.raw(), out.numel() / inter, inter, stream_);
  }

  void add(Tensor& x, const Tensor& y) override {
    MX_CHECK_EQ(x.numel(), y.numel());
    MX_CHECK_MSG(x.dtype() == y.dtype(), "cuda add: " << x.describe() << " += " << y.describe());
    if (x.dtype() == DType::kF32) {
      kc::add_f32(x.data<float>(), y.data<float>(), x.numel(), stream_);
    } else {
      expect(x, DType::kBF16, "add", "x");
      expect(y, DType::kBF16, "add", "y");
      kc::add_bf16(x.raw(), y.raw(), x.numel(), stream_);
    }
  }

  void kv_write(const Tensor& k, const Tensor& v, const AttentionMeta& meta, Tensor& k_cache,
                Tensor& v_cache) override {
    expect(k, DType::kBF16, "kv_write", "k");
    expect(v, DType::kBF16, "kv_write", "v");
    expect(meta.slot_mapping, DType::kI32, "kv_write", "slot_mapping");
    const auto& p = meta.params;
    const int64_t width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
    MX_CHECK_EQ(k.numel(), v.numel());
    MX_CHECK_EQ(k.numel() % width, 0);
    MX_CHECK_EQ(k_cache.numel() % width, 0);
    if (p.fp8_kv()) {
      expect_fp8_cache(k_cache, v_cache, p, "kv_write");
      kc::kv_write_fp8(k.raw(), v.raw(), meta.slot_mapping.data<int32_t>(), k_cache.raw(), v_cache.raw(), p.k_scales,
                       p.v_scales, k.numel() / width, p.n_kv_heads, p.head_dim, stream_);
      return;
    }
    expect(k_cache, DType::kBF16, "kv_write", "k_cache");
    expect(v_cache, DType::kBF16, "kv_write", "v_cache");
    kc::kv_write_bf16(k.raw(), v.raw(), meta.slot_mapping.data<int32_t>(), k_cache.raw(), v_cache.raw(),
                      k.numel() / width, width, stream_);
  }

  // One kernel (kernels/cuda/rope_kv_write.h) when MXSERVE_FUSED_ROPE_KV=1, or unset and kFusedRopeKvDefault;
  // else Backend's composed ops (copy_columns on the device, views of y's one row at T == 1, rope(q), rope(k),
  // kv_write; graph-safe). Both write the same bits (test_cuda_rope_kv_write).
  // With the composed ops (=0) attention keeps its earlier ops (one_qkv_gemm false): q / k / v GEMMs above one
  // row, views of the one GEMM at one row, then rope, rope, kv_write.
  bool one_qkv_gemm(int64_t rows) const override {
    (void)rows;
    return fused_rope_kv();
  }
  static bool fused_rope_kv() {
    static const bool fused = [] {
      const char* v = std::getenv("MXSERVE_FUSED_ROPE_KV");
      const bool on = v == nullptr || *v == '\0' ? kc::kFusedRopeKvDefault : std::strcmp(v, "0") != 0;
      if (on) {
        MX_LOG(kInfo) << "attention: one QKV GEMM at every row count, RoPE + K/V cache write as one fused kernel "
                         "per layer (rope_kv_write; MXSERVE_FUSED_ROPE_KV=0 runs the separate ops)";
      } else {
        MX_LOG(kInfo) << "attention: q / k / v GEMMs above one row (views of one QKV GEMM at one row), rope q, "
                      << "rope k, kv_write -- "
                      << (v == nullptr ? "kFusedRopeKvDefault is false in this build" : "MXSERVE_FUSED_ROPE_KV=0")
                      << "; MXSERVE_FUSED_ROPE_KV=1 runs the fused kernel";
      }
      return on;
    }();
    return fused;
  }
  Tensor rope_kv_write(Tensor& y, const Tensor& positions, const kernels::RopeParams& p, const AttentionMeta& meta,
                       Tensor& k_cache, Tensor& v_cache) override {
    const bool fused = fused_rope_kv();
    expect(y, DType::kBF16, "rope_kv_write", "y");
    expect(positions, DType::kI32, "rope_kv_write", "positions");
    expect(meta.slot_mapping, DType::kI32, "rope_kv_write", "slot_mapping");
    const auto& ap = meta.params;
    const int64_t hd = p.head_dim, nq = static_cast<int64_t>(p.n_heads) * hd, nkv = int64_t{ap.n_kv_heads} * hd;
    const int64_t T = y.ndim() == 2 ? y.dim(0) : -1;
    MX_CHECK_MSG(y.ndim() == 2 && y.dim(1) == nq + 2 * nkv && y.is_contiguous() && positions.numel() == T &&
                     meta.slot_mapping.numel() >= T && ap.head_dim == p.head_dim && nq % 8 == 0 && nkv % 8 == 0 &&
                     p.rotary_dim % 2 == 0 && p.rotary_dim <= p.head_dim &&
                     p.head_dim <= kc::kRopeKvWriteMaxHeadDim,
                 "cuda rope_kv_write: y " << y.describe() << " for " << p.n_heads << " q heads, " << ap.n_kv_heads
                                          << " kv heads x " << hd << " (attention head_dim " << ap.head_dim
                                          << ", rotary_dim " << p.rotary_dim << "), " << positions.numel()
                                          << " positions, " << meta.slot_mapping.numel() << " slots");
    if (ap.fp8_kv()) {
      expect_fp8_cache(k_cache, v_cache, ap, "rope_kv_write");
    } else {
      expect(k_cache, DType::kBF16, "rope_kv_write", "k_cache");
      expect(v_cache, DType::kBF16, "rope_kv_write", "v_cache");
    }
    MX_CHECK_MSG(k_cache.numel() % nkv == 0 && k_cache.numel() == v_cache.numel(),
                 "cuda rope_kv_write: caches " << k_cache.describe() << ", " << v_cache.describe() << " for rows of "
                                               << nkv);
    if (fused) {
      Tensor q = alloc(DType::kBF16, {T, nq});
      kc::rope_kv_write_bf16(y.raw(), positions.data<int32_t>(), T, p, ap.n_kv_heads,
                             meta.slot_mapping.data<int32_t>(), q.raw(), k_cache.raw(), v_cache.raw(), ap.k_scales,
                             ap.v_scales, stream_);
      return q;
    }
    return Backend::rope_kv_write(y, positions, p, meta, k_cache, v_cache);  // the composed ops (graph-safe)
  }

  // Tensors are paired in layout order (two of one shape and dtype per launch, e.g. K and V, or their
  // scales); one without a partner goes alone. Rows are copied as bytes: bf16, FP8 codes and f32 scales.
  void kv_copy(const Tensor& src_slots, const Tensor& dst_slots, const std::vector<Tensor*>& caches) override {
    expect(src_slots, DType::kI32, "kv_copy", "src_slots");
    expect(dst_slots, DType::kI32, "kv_copy", "dst_slots");
    MX_CHECK_EQ(src_slots.numel(), dst_slots.numel());
    for (size_t c = 0; c < caches.size();) {
      Tensor& a = *caches[c];
      const bool pair = c + 1 < caches.size() && caches[c + 1]->dim(1) == a.dim(1) &&
                        caches[c + 1]->dim(0) == a.dim(0) && caches[c + 1]->dtype() == a.dtype();
      Tensor& b = pair ? *caches[c + 1] : a;
      kc::kv_copy_rows(src_slots.data<int32_t>(), dst_slots.data<int32_t>(), src_slots.numel(), a.raw(), b.raw(),
                       static_cast<int64_t>(a.nbytes()) / a.dim(0), stream_);
      c += pair ? 2 : 1;
    }
  }
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMeta& meta,
                 Tensor& out) override {
    expect(q, DType::kBF16, "attention", "q");
    if (meta.params.fp8_kv()) {
      expect_fp8_cache(k_cache, v_cache, meta.params, "attention");
    } else {
      expect(k_cache, DType::kBF16, "attention", "k_cache");
      expect(v_cache, DType::kBF16, "attention", "v_cache");
    }
    expect(out, DType::kBF16, "attention", "out");
    for (const Tensor* t : {&meta.token_seq, &meta.kv_index, &meta.block_tables})
      expect(*t, DType::kI32, "attention", "metadata");
    const auto& p = meta.params;
    if (p.tree_mask != nullptr) {
      expect(meta.tree_mask, DType::kI64, "attention", "tree_mask");
      expect(meta.tree_base, DType::kI32, "attention", "tree_base");
    }
    MX_CHECK_EQ(q.numel(), static_cast<int64_t>(p.n_tokens) * p.n_heads * p.head_dim);
    MX_CHECK_EQ(out.numel(), q.numel());
    // Mixed batches: the leading plain decode rows get the decode kernel (kc::plan_paged_attention_batch).
    kc::AttentionPlanOptions options = attention_options_;
    options.split_table = split_table_for(p);
    if (use_cascade(meta)) {  // shared-prefix decode groups (kernels/cascade_attention.h)
      expect(meta.cascade, DType::kI32, "attention", "cascade");
      MX_CHECK_EQ(meta.cascade.numel(), meta.cascade_shape.n_ints());
      const kc::CascadeBatchPlan plan = kc::plan_cascade_batch(p, meta.cascade_shape, n_sms_, options);
      Tensor ws;
      if (plan.workspace_bytes > 0) ws = alloc(DType::kU8, {static_cast<int64_t>(plan.workspace_bytes)});
      kc::cascade_attention_batch(q.raw(), k_cache.raw(), v_cache.raw(), meta.token_seq.data<int32_t>(),
                                  meta.kv_index.data<int32_t>(), meta.block_tables.data<int32_t>(),
                                  meta.cascade.data<int32_t>(), out.raw(), meta.cascade_shape, plan, ws.raw(), stream_);
      return;
    }
    const kc::AttentionBatchPlan plan = kc::plan_paged_attention_batch(p, n_sms_, options);
    report_split_source(plan, p);
    Tensor ws;
    if (plan.workspace_bytes > 0) ws = alloc(DType::kU8, {static_cast<int64_t>(plan.workspace_bytes)});
    kc::paged_attention_batch(q.raw(), k_cache.raw(), v_cache.raw(), meta.token_seq.data<int32_t>(),
                              meta.kv_index.data<int32_t>(), meta.block_tables.data<int32_t>(), out.raw(), plan,
                              ws.raw(), stream_);
  }

  void router(const Tensor& x, const Tensor& gate_w, const Tensor& bias, const kernels::RouterParams& p,
              Tensor& topk_ids, Tensor& topk_weights) override {
    expect(x, DType::kBF16, "router", "x");
    expect(gate_w, DType::kBF16, "router", "gate_w");
    expect(bias, DType::kF32, "router", "e_score_correction_bias");
    expect(topk_ids, DType::kI32, "router", "topk_ids");
    expect(topk_weights, DType::kF32, "router", "topk_weights");
    const int64_t n_tokens = x.dim(0);
    MX_CHECK_EQ(gate_w.dim(0), p.n_experts);
    MX_CHECK_EQ(topk_ids.numel(), n_tokens * p.top_k);
    // Router GEMM: bf16 operands, fp32 accumulation and fp32 logits (the scores are computed in fp32).
    Tensor logits = alloc(DType::kF32, {n_tokens, p.n_experts});
    gemm_->run(x.raw(), gate_w.raw(), nullptr, logits.raw(), /*out_f32=*/true, n_tokens, p.n_experts, x.dim(1));
    kc::moe_router(logits.data<float>(), bias.numel() > 0 ? bias.data<float>() : nullptr,
                   topk_ids.data<int32_t>(), topk_weights.data<float>(), n_tokens, p, stream_);
  }

  void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights, const ExpertWeights& ex,
                   Tensor& out) override {
    expect(x, DType::kBF16, "moe_experts", "x");
    expect(topk_ids, DType::kI32, "moe_experts", "topk_ids");
    expect(topk_weights, DType::kF32, "moe_experts", "topk_weights");
    expect(out, DType::kBF16, "moe_experts", "out");
    // Expert parallelism: the router's global ids become local ids of [first_expert, first_expert + E), other
    // ranks' experts kForeignExpert (skipped by the kernels): out gets this rank's partial sum.
    Tensor local_ids;
    const Tensor* ids = &topk_ids;
    if (ex.partitioned()) {
      MX_CHECK_MSG(ex.first_expert >= 0 && ex.first_expert + ex.n_experts() <= ex.global_experts,
                   "cuda moe_experts: expert range [" << ex.first_expert << ", " << ex.first_expert + ex.n_experts()
                                                      << ") is outside the layer's " << ex.global_experts << " experts");
      local_ids = alloc(DType::kI32, topk_ids.shape());
      kc::moe_local_expert_ids(topk_ids.data<int32_t>(), topk_ids.numel(), static_cast<int32_t>(ex.first_expert),
                               static_cast<int32_t>(ex.n_experts()), local_ids.data<int32_t>(), stream_);
      ids = &local_ids;
    }
    switch (ex.format) {
      case ExpertFormat::kFloat: return moe_experts_float(x, *ids, topk_weights, ex, out);
      case ExpertFormat::kMxfp4: return moe_experts_mxfp4(x, *ids, topk_weights, ex, out);
    }
    MX_CHECK_MSG(false, "cuda moe_experts: expert format " << expert_format_name(ex.format) << " not implemented");
  }

  void moe_experts_float(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights, const ExpertWeights& ex,
                         Tensor& out) {
    expect(ex.gate_up, DType::kBF16, "moe_experts", "gate_up");
    expect(ex.down, DType::kBF16, "moe_experts", "down");
    kc::MoeShape s = routed_shape(x, topk_ids, ex.gate_up.dim(0), ex.down.dim(2));
    s.force_grouped = force_grouped_moe_;
    MX_CHECK_EQ(ex.gate_up.dim(1), 2 * s.inter);
    MX_CHECK_EQ(ex.gate_up.dim(2), s.d_model);
    MX_CHECK_EQ(ex.down.dim(1), s.d_model);
    MX_CHECK_EQ(out.numel(), s.n_tokens * s.d_model);
    Tensor ws = alloc(DType::kU8, {static_cast<int64_t>(kc::moe_workspace_bytes(s))});
    kc::moe_experts_bf16(x.raw(), topk_ids.data<int32_t>(), topk_weights.data<float>(), ex.gate_up.raw(),
                         ex.down.raw(), out.raw(), s, ws.raw(), stream_);
  }

  // MXFP4 experts (layouts in backend.h): the variant pair comes from the shape's load-time plan (the tuned
  // table of this GPU and shape for the bucket of M = n_tokens, else the kernels' heuristic; kernels/moe_plan.h).
  void moe_experts_mxfp4(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights, const ExpertWeights& ex,
                         Tensor& out) {
    expect(ex.gate_up, DType::kU8, "moe_experts", "gate_up (mxfp4 codes)");
    expect(ex.gate_up_scales, DType::kU8, "moe_experts", "gate_up_scales (e8m0)");
    expect(ex.down, DType::kU8, "moe_experts", "down (mxfp4 codes)");
    expect(ex.down_scales, DType::kU8, "moe_experts", "down_scales (e8m0)");
    kc::MoeShape s = routed_shape(x, topk_ids, ex.gate_up.dim(0), ex.inter());
    s.fp8_activations = fp8_moe_activations_;
    MX_CHECK_MSG(s.d_model % 32 == 0 && s.inter % 32 == 0,
                 "cuda moe_experts mxfp4: d_model " << s.d_model << " and inter " << s.inter << " must be multiples of 32");
    MX_CHECK_EQ(ex.gate_up.dim(2), s.d_model / 2);
    MX_CHECK_EQ(ex.gate_up_scales.dim(0), s.n_experts);
    MX_CHECK_EQ(ex.gate_up_scales.dim(1), 2 * s.inter);
    MX_CHECK_EQ(ex.gate_up_scales.dim(2), s.d_model / 32);
    MX_CHECK_EQ(ex.down.dim(0), s.n_experts);
    MX_CHECK_EQ(ex.down.dim(1), s.d_model);
    MX_CHECK_EQ(ex.down.dim(2), s.inter / 2);
    MX_CHECK_EQ(ex.down_scales.dim(1), s.d_model);
    MX_CHECK_EQ(ex.down_scales.dim(2), s.inter / 32);
    MX_CHECK_EQ(out.numel(), s.n_tokens * s.d_model);
    const kernels::MoeKernelPlan& kernel_plan = moe_plan(ex, s);
    const kernels::MoeChoice c = kernel_plan.choose(s.n_tokens);
    kc::MoeMxfp4Plan plan = c.heuristic ? kc::moe_mxfp4_heuristic_plan(s) : kc::MoeMxfp4Plan{c.gate_up, c.down};
    plan.foreign_ids = ex.partitioned();
    kc::MoeMxfp4Weights w;
    w.gate_up_q = ex.gate_up.data<uint8_t>();
    w.gate_up_s = ex.gate_up_scales.data<uint8_t>();
    w.down_q = ex.down.data<uint8_t>();
    w.down_s = ex.down_scales.data<uint8_t>();
    // Issue 33 item 2 prototype: dequantize the step's active experts to bf16 once, then a bf16 wgmma grouped
    // GEMM, for calls of >= kMoePrefillDequantMinTokens tokens; off unless MXSERVE_MOE_PREFILL_DEQUANT=1 or
    // moe_kernel "prefill_dequant" (moe_prefill_dequant.h; logged once when on).
    if (kc::moe_prefill_dequant_enabled(s, prefill_dequant_moe_)) {
      Tensor dws = alloc(DType::kU8, {static_cast<int64_t>(kc::moe_prefill_dequant_workspace_bytes(s))});
      kc::moe_experts_mxfp4_prefill_dequant(x.raw(), topk_ids.data<int32_t>(), topk_weights.data<float>(), w,
                                            out.raw(), s, kc::MoePrefillDequantPlan{}, dws.raw(), stream_);
      return;
    }
    const size_t ws_bytes = kc::moe_mxfp4_workspace_bytes(s);
    Tensor ws;
    if (ws_bytes > 0) ws = alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
    // Design 9, the persistent decode path (2 launches): only where switched on (kMoeMxfp4PdDefault in
    // kernels/cuda/moe_mxfp4/moe_mxfp4_pd.h, or MXSERVE_MOE_MXFP4_PD=1) and the call is decode-sized.
    if (kc::moe_mxfp4_pd_enabled(s)) {
      kc::moe_experts_mxfp4_pd(x.raw(), topk_ids.data<int32_t>(), topk_weights.data<float>(), w, out.raw(), s,
                               ws.raw(), stream_);
      return;
    }
    kc::moe_experts_mxfp4(x.raw(), topk_ids.data<int32_t>(), topk_weights.data<float>(), w, out.raw(), s, plan,
                          ws_bytes > 0 ? ws.raw() : nullptr, stream_);
  }

  // The plan prepare_moe attached at load. Experts never prepared (a tool or test building ExpertWeights by
  // hand) get theirs by key here: a string key and a lock on every such call.
  const kernels::MoeKernelPlan& moe_plan(const ExpertWeights& ex, const kc::MoeShape& s) {
    const kernels::MoeKernelPlan& p = ex.kernel_plan ? *ex.kernel_plan : moe_planner_->prepare(moe_key(ex, s.top_k));
    const kernels::MoeTuningKey& k = p.key();
    MX_CHECK_MSG(k.experts == s.n_experts && k.hidden == s.d_model && k.inter == s.inter && k.top_k == s.top_k,
                 "cuda moe_experts: the experts' kernel plan is for " << k.shape_label() << ", the call is E"
                     << s.n_experts << "_H" << s.d_model << "_I" << s.inter << "_K" << s.top_k);
    return p;
  }

  kernels::MoeTuningKey moe_key(const ExpertWeights& ex, int64_t top_k) const {
    kernels::MoeTuningKey k;
    k.gpu = gpu_name_;
    k.experts = ex.n_experts();
    k.inter = ex.inter();
    k.hidden = ex.format == ExpertFormat::kMxfp4 ? ex.down.dim(1) : ex.gate_up.dim(2);
    k.top_k = top_k;
    k.dtype = expert_format_name(ex.format);
    return k;
  }

  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override {
    expect(rows, DType::kI32, "gather_rows", "rows");
    MX_CHECK_MSG(x.dtype() == out.dtype() && x.is_contiguous() && out.is_contiguous(),
                 "cuda gather_rows: " << x.describe() << " -> " << out.describe());
    const int64_t row_bytes = static_cast<int64_t>(x.nbytes() / x.dim(0));
    MX_CHECK_EQ(out.nbytes(), static_cast<uint64_t>(row_bytes * rows.numel()));
    kc::gather_rows(x.raw(), rows.data<int32_t>(), out.raw(), rows.numel(), row_bytes, stream_);
  }

  void argmax_rows(const Tensor& logits, Tensor& out) override {
    expect(logits, DType::kF32, "argmax_rows", "logits");
    expect(out, DType::kI32, "argmax_rows", "out");
    MX_CHECK_MSG(logits.ndim() == 2 && out.numel() == logits.dim(0),
                 "cuda argmax_rows: " << logits.describe() << " -> " << out.describe());
    kc::argmax_rows_f32(logits.data<float>(), out.data<int32_t>(), logits.dim(0), logits.dim(1), stream_);
  }

  // One packed upload (row params, penalty tokens, bias entries), the two kernels, one packed download.
  std::vector<kernels::SampledRow> sample_rows(const Tensor& logits, const kernels::SampleRowsInput& in) override {
    expect(logits, DType::kF32, "sample_rows", "logits");
    MX_CHECK_MSG(logits.ndim() == 2 && logits.is_contiguous(), "cuda sample_rows: logits " << logits.describe());
    const int64_t n = static_cast<int64_t>(in.rows.size()), V = logits.dim(1);
    std::vector<kernels::SampledRow> result(n);
    if (n == 0) return result;
    auto align8 = [](size_t b) { return (b + 7) & ~size_t{7}; };
    const size_t rows_bytes = align8(n * sizeof(kernels::SampleRowParams));
    const size_t pen_bytes = align8(in.penalties.size() * sizeof(kernels::SamplePenaltyToken));
    const size_t bias_bytes = align8(in.biases.size() * sizeof(kernels::SampleBias));
    std::vector<uint8_t> packed(rows_bytes + pen_bytes + bias_bytes);
    std::memcpy(packed.data(), in.rows.data(), n * sizeof(kernels::SampleRowParams));
    if (!in.penalties.empty())
      std::memcpy(packed.data() + rows_bytes, in.penalties.data(), in.penalties.size() * sizeof(in.penalties[0]));
    if (!in.biases.empty())
      std::memcpy(packed.data() + rows_bytes + pen_bytes, in.biases.data(), in.biases.size() * sizeof(in.biases[0]));
    Tensor dev_in = upload(Tensor::view_of(packed.data(), DType::kU8, {static_cast<int64_t>(packed.size())}));
    const int32_t max_top = in.max_top();
    const size_t res_bytes = n * sizeof(kc::DeviceSampleResult), top_count = static_cast<size_t>(n) * max_top;
    Tensor dev_out = alloc(DType::kU8, {static_cast<int64_t>(res_bytes + 8 * top_count)});
    bool any_processing = false;
    for (const auto& r : in.rows) any_processing |= kc::row_has_processing(r);
    Tensor scratch = any_processing ? alloc(DType::kF32, {n, V}) : Tensor();
    kc::DeviceSampleArgs a;
    uint8_t* din = dev_in.data<uint8_t>();
    uint8_t* dout = dev_out.data<uint8_t>();
    a.logits = logits.data<float>();
    a.n_logit_rows = logits.dim(0);
    a.vocab = V;
    a.rows = reinterpret_cast<const kernels::SampleRowParams*>(din);
    a.n_sample = static_cast<int32_t>(n);
    a.penalties = reinterpret_cast<const kernels::SamplePenaltyToken*>(din + rows_bytes);
    a.biases = reinterpret_cast<const kernels::SampleBias*>(din + rows_bytes + pen_bytes);
    a.scratch = any_processing ? scratch.data<float>() : nullptr;
    a.out = reinterpret_cast<kc::DeviceSampleResult*>(dout);
    a.max_top = max_top;
    a.top_ids = reinterpret_cast<int32_t*>(dout + res_bytes);
    a.top_logprobs = reinterpret_cast<float*>(dout + res_bytes + 4 * top_count);
    if (any_processing) kc::process_sample_rows(a, stream_);
    kc::sample_rows(a, stream_);
    Tensor host = to_host(dev_out);  // waits
    const auto* res = reinterpret_cast<const kc::DeviceSampleResult*>(host.data<uint8_t>());
    const auto* top_ids = reinterpret_cast<const int32_t*>(host.data<uint8_t>() + res_bytes);
    const auto* top_lps = reinterpret_cast<const float*>(host.data<uint8_t>() + res_bytes + 4 * top_count);
    for (int64_t i = 0; i < n; ++i) {
      kernels::SampledRow& o = result[i];
      o.token = res[i].token;
      o.logprob = res[i].logprob;
      o.error = res[i].error;
      o.error_token = res[i].error_token;
      const int64_t n_top = o.error == kernels::kSampleOk ? std::min<int64_t>(in.rows[i].n_top, V) : 0;
      for (int64_t j = 0; j < n_top; ++j) o.top.emplace_back(top_ids[i * max_top + j], top_lps[i * max_top + j]);
    }
    return result;
  }

  void fill_synthetic(const kernels::SyntheticFill& p, Tensor& dst, Tensor* scales) override {
    if (p.kind == kernels::SyntheticKind::kMxfp4) {
      expect(dst, DType::kU8, "fill_synthetic", "packed codes");
      MX_CHECK_MSG(scales != nullptr, "cuda fill_synthetic: mxfp4 needs a scales tensor");
      expect(*scales, DType::kU8, "fill_synthetic", "scales");
      // A window of whole 32-element blocks (a rank's slice) or whole rows.
      MX_CHECK_MSG(p.cols % 32 == 0 && p.src_cols % 32 == 0 && p.col_offset % 32 == 0 &&
                       dst.numel() == p.rows * p.cols / 2 && scales->numel() == p.rows * p.cols / 32,
                   "cuda fill_synthetic mxfp4: dst " << dst.describe() << ", scales " << scales->describe()
                                                     << " for [" << p.rows << ", " << p.cols << "]");
      kc::synthetic_fill(p, dst.raw(), false, scales->data<uint8_t>(), stream_);
      return;
    }
    MX_CHECK_MSG(dst.dtype() == DType::kF32 || dst.dtype() == DType::kBF16,
                 "cuda fill_synthetic: dst " << dst.describe() << " (f32 or bf16 implemented)");
    expect(dst, dst.dtype(), "fill_synthetic", "dst");
    MX_CHECK_MSG(dst.numel() == p.rows * p.cols,
                 "cuda fill_synthetic: dst " << dst.describe() << " for [" << p.rows << ", " << p.cols << "]");
    MX_CHECK_MSG(p.kind == kernels::SyntheticKind::kNormal ||
                     (p.cols % 32 == 0 && p.src_cols % 32 == 0 && p.col_offset % 32 == 0),
                 "cuda fill_synthetic mxfp4-dequant: cols " << p.cols << " at " << p.col_offset
                                                            << " (whole 32-element blocks)");
    kc::synthetic_fill(p, dst.raw(), dst.dtype() == DType::kBF16, nullptr, stream_);
  }

  cudaStream_t stream() const { return stream_; }
  MemoryInterval memory_interval() {
    const kc::CachingAllocator::Interval i = pool_->take_interval();
    return {true, i.in_use, i.peak};
  }
  DeviceMemory memory(bool reset_peak) {
    DeviceMemory m;
    m.known = true;
    m.device = device_;
    m.in_use = pool_->bytes_in_use();
    m.cached = pool_->bytes_cached();
    m.peak_in_use = pool_->peak_bytes_in_use();
    m.graph_pool = graph_pool_ ? graph_pool_->bytes() : 0;
    size_t free_b = 0, total_b = 0;
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device_) cudaSetDevice(device_);
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) m.device_free = free_b, m.device_total = total_b;
    if (current >= 0 && current != device_) cudaSetDevice(current);
    if (reset_peak) pool_->reset_peak();
    return m;
  }

 private:
  // Whether meta's cascade buffer is run: the option is on, the buffer is there, the kernels serve the shape
  // and the buffer was encoded for this query-head group (a graph encodes with the model's G). Else the
  // per-sequence kernels run (always exact), said once where the buffer was there but cannot be used.
  bool use_cascade(const AttentionMeta& meta) const {
    // A default Tensor is a 0-d f32 scalar (numel 1): the buffer is there only as the batch builder's 1-d i32.
    if (!cascade_attention_ || meta.cascade.ndim() != 1 || meta.cascade.numel() == 0 ||
        meta.params.n_leading_decode_rows <= 0)
      return false;
    const auto& p = meta.params;
    const char* why = nullptr;
    if (!kc::cascade_attention_supports(p, &why)) {
      MX_WARN_ONCE << "cascade attention: not for this batch (" << why << "): per-sequence decode attention runs";
      return false;
    }
    if (meta.cascade_shape.group_size != p.n_heads / p.n_kv_heads) {
      MX_WARN_ONCE << "cascade attention: the prefix groups were encoded for " << meta.cascade_shape.group_size
                   << " q heads per kv head, this rank has " << p.n_heads / p.n_kv_heads
                   << " (kv heads replicated under tensor parallelism?): per-sequence decode attention runs";
      return false;
    }
    return true;
  }

  // The tuned decode split table of this device for p's cache dtype and head geometry (null: none).
  const kernels::AttentionSplitTable* split_table_for(const kernels::AttentionParams& p) {
    kernels::AttentionTuningKey key{gpu_name_, p.fp8_kv() ? "fp8_e4m3" : "bf16", p.n_heads, p.n_kv_heads, p.head_dim};
    for (const auto& [k, t] : split_tables_)
      if (k == key) return t;
    const kernels::AttentionSplitTable* t = kernels::find_attention_split_table(key);
    split_tables_.emplace_back(std::move(key), t);
    return t;
  }
  // No silent fallbacks: the decode kernel's split count from the heuristic is said once (no tuned table for
  // this device and shape, or a shape beyond the table's grid), with the command that tunes it.
  static void report_split_source(const kc::AttentionBatchPlan& plan, const kernels::AttentionParams& p) {
    for (int i = 0; i < plan.n_parts; ++i) {
      const kc::AttentionLaunch& l = plan.parts[i].launch;
      if (l.kernel != kc::AttentionKernel::kWarp) continue;
      if (l.split_source == kc::AttentionSplitSource::kHeuristic) {
        MX_WARN_ONCE << "decode attention: no tuned split table for this GPU, " << (p.fp8_kv() ? "fp8_e4m3" : "bf16")
                     << " cache, heads " << p.n_heads << "/" << p.n_kv_heads << "x" << p.head_dim
                     << " (configs/attention/ has none, or only an untuned one): the split count comes from the "
                        "heuristic (warps per SM by batch size). Tune it: mxserve tune-attention --heads "
                     << p.n_heads << " --kv-heads " << p.n_kv_heads << " --head-dim " << p.head_dim
                     << " --kv-cache-dtype " << (p.fp8_kv() ? "fp8_e4m3" : "bf16")
                     << " (docs/perf/decode-path.md)";
      } else if (l.split_source == kc::AttentionSplitSource::kOutsideTable) {
        MX_WARN_ONCE << "decode attention: " << plan.parts[i].params.n_tokens << " rows at context up to "
                     << (p.max_kv_len > 0 ? p.max_kv_len : p.max_blocks_per_seq * p.block_size)
                     << " lie outside the tuned split table's grid: the heuristic split runs for such shapes. "
                        "Re-tune with a larger grid (mxserve tune-attention --max-rows / --max-context, "
                        "docs/perf/decode-path.md)";
      }
    }
  }

  // A graph body must take its inputs from device buffers: a copy inside it would be captured from a host
  // buffer that changes between replays (or synchronize a capturing stream).
  void no_copy_in_graph(const char* op) const {
    MX_CHECK_MSG(!in_graph_body_, "cuda " << op << " inside a graph body (capture_graph): inputs must already be "
                                            "on the device");
  }

  static constexpr size_t kStagingBytes = size_t{64} << 20;
  int device_ = 0;
  int n_sms_ = 0;
  kc::AttentionPlanOptions attention_options_;  // set_kernel_options (tests and benchmarks)
  bool cascade_attention_ = true;               // set_kernel_options: KernelOptions::cascade_attention
  int64_t cascade_min_saved_bytes_ = kernels::kCascadeMinSavedBytes;
  bool force_grouped_moe_ = false;              // set_kernel_options: moe_kernel "grouped" (benchmarks)
  bool prefill_dequant_moe_ = false;            // set_kernel_options: moe_kernel "prefill_dequant" (MXFP4 prefill)
  bool fp8_moe_activations_ = false;            // set_kernel_options: moe_activation_dtype "fp8_e4m3" (W4A8)
  bool fp8_announced_ = false;                  // the W4A8 info line is logged once (the start-up gate toggles it)
  void* staging_ = nullptr;  // pinned upload ring (see upload)
  size_t staging_off_ = 0;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<kc::CachingAllocator> pool_;
  std::shared_ptr<kc::PrivatePool> graph_pool_;  // temporaries of every captured graph (capture_graph)
  bool in_graph_body_ = false;
  std::unique_ptr<kc::LtGemm> gemm_;
  std::string gpu_name_;  // cudaDeviceProp::name: the tuned tables' key
  std::vector<std::pair<kernels::AttentionTuningKey, const kernels::AttentionSplitTable*>> split_tables_;
  std::unique_ptr<kernels::MoeKernelPlanner> moe_planner_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return unavailable(std::string("--backend cuda: no usable CUDA device (") + cudaGetErrorString(err) + ")");
  }
  if (count == 0) return unavailable("--backend cuda: no CUDA device present");
  if (options.device < 0 || options.device >= count)
    return invalid_argument("--backend cuda: device " + std::to_string(options.device) + " does not exist (" +
                            std::to_string(count) + " present)");
  auto be = std::make_unique<CudaBackend>(options.device);
  MX_RETURN_IF_ERROR(be->validate_moe_tables());
  MX_RETURN_IF_ERROR(be->set_kernel_options(options.kernels));
  if (options.kernels.cascade_attention)
    MX_LOG(kInfo) << "cascade attention: on -- decode rows whose block tables share >= "
                  << kernels::kCascadeMinSharedBlocks << " leading blocks (groups of 2.." << kernels::kCascadeMaxGroup
                  << ") attend the shared prefix once per group when that saves >= "
                  << (options.kernels.cascade_min_saved_bytes >> 20) << " MiB of K/V reads per layer (--disable-cascade-attention "
                     "turns it off)";
  else
    MX_LOG(kInfo) << "cascade attention: off (--disable-cascade-attention): every decode row reads its whole context";
  return std::unique_ptr<Backend>(std::move(be));
}

void cuda_backend_set_graph_body(Backend& be, bool on) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  MX_CHECK_MSG(cuda != nullptr, "cuda_backend_set_graph_body: backend '" << be.name() << "' is not the CUDA backend");
  cuda->set_graph_body(on);
}

DeviceMemory cuda_backend_memory(Backend& be, bool reset_peak) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  MX_CHECK_MSG(cuda != nullptr, "cuda_backend_memory: backend '" << be.name() << "' is not the CUDA backend");
  return cuda->memory(reset_peak);
}

MemoryInterval cuda_backend_memory_interval(Backend& be) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  MX_CHECK_MSG(cuda != nullptr, "cuda_backend_memory_interval: backend '" << be.name() << "' is not the CUDA backend");
  return cuda->memory_interval();
}

Result<std::unique_ptr<DeviceGraph>> cuda_backend_capture_graph_thread_local(Backend& be,
                                                                             const std::function<void()>& body) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  if (cuda == nullptr) return invalid_argument("thread-local graph capture: backend '" + be.name() + "' is not the CUDA backend");
  return cuda->capture_graph_in(body, cudaStreamCaptureModeThreadLocal);
}

Status cuda_graph_try_replay(DeviceGraph& graph) {
  auto* g = dynamic_cast<CudaGraph*>(&graph);
  if (g == nullptr) return invalid_argument("cuda_graph_try_replay: not a graph of the CUDA backend");
  return g->try_replay();
}

CUstream_st* cuda_backend_stream(Backend& be) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  MX_CHECK_MSG(cuda != nullptr, "cuda_backend_stream: backend '" << be.name() << "' is not the CUDA backend");
  return cuda->stream();
}

}  // namespace mxserve::backend
