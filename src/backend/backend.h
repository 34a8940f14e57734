// Backend: the interface the model computes through, shared by the CPU reference and the CUDA backend.
// Owns: device memory allocation, host<->device copies, and the op table. Every op validates nothing
// user-facing (the model validated the batch); each has a CPU and a CUDA implementation, and a dtype or
// shape a backend does not implement fails loudly at the op's entry, naming the op and the tensor --
// never a silent fallback to another backend.
// Shapes: T tokens, H d_model, E experts, K top_k, I expert width, V vocab.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cascade_attention.h"
#include "kernels/moe_tuning.h"
#include "kernels/op_params.h"
#include "kernels/sampling_params.h"
#include "kernels/synthetic_fill.h"

namespace mxserve::kernels {
class MoeKernelPlan;
}  // namespace mxserve::kernels

namespace mxserve::backend {

// Paged-attention metadata for one batch, on the backend's device.
struct AttentionMeta {
  Tensor token_seq;     // i32 [T]: block_tables row of each token's sequence (distinct sequences, distinct rows)
  Tensor kv_index;      // i32 [T]: KV index of each token within its sequence (attends to [0, kv_index])
  Tensor slot_mapping;  // i32 [T]: cache slot where the token's K/V are written
  // i32 [rows, max_blocks_per_seq]: engine batches point at the persistent store (kvcache/block_table_store.h),
  // one row per live sequence; batches built by hand get a temporary table with one row per sequence.
  Tensor block_tables;
  // Tree rows (speculative trees): i64 [T] ancestor bitmask and i32 [T] KV index of bit 0; empty for a
  // plain causal batch. params.tree_mask / tree_base point at them (see kernels::AttentionParams).
  Tensor tree_mask;
  Tensor tree_base;
  kernels::AttentionParams params;
  // Cascade (shared-prefix) decode attention (kernels/cascade_attention.h): the encoded i32 buffer
  // [cascade_shape.n_ints()] over the leading plain decode rows, on the device; empty = per-sequence attention.
  // Set by the batch builder only where Backend::cascade_attention_enabled() and the sharing pays (or, in
  // a decode graph, always: the buffer is rewritten before each replay).
  Tensor cascade;
  kernels::CascadeShape cascade_shape;
};

// How the routed experts of one MoE layer are stored on a backend.
enum class ExpertFormat {
  kFloat,  // gate_up / down in the backend's weight dtype (bf16 on CUDA, f32 on CPU)
  kMxfp4,  // OCP MXFP4: packed E2M1 codes (2 per byte, element 2i in the low nibble) + E8M0 scale per 32 along K
};
const char* expert_format_name(ExpertFormat f);

// Stacked routed-expert weights of one MoE layer.
//   kFloat: gate_up [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up: transformers 5.x in-memory layout), down [E, H, I].
//   kMxfp4: gate_up u8 [E, 2I, H/2], gate_up_scales u8 [E, 2I, H/32]; down u8 [E, H, I/2],
//           down_scales u8 [E, H, I/32] (H % 32 == 0, I % 32 == 0; same row order as kFloat).
// E is the experts this rank holds: all of the layer's, or (expert parallelism) the contiguous range
// [first_expert, first_expert + E) of global_experts; router ids outside that range belong to other ranks.
struct ExpertWeights {
  Tensor gate_up;
  Tensor down;
  ExpertFormat format = ExpertFormat::kFloat;
  Tensor gate_up_scales;  // kMxfp4 only
  Tensor down_scales;     // kMxfp4 only
  // The kernel plan of this shape on the backend that loaded it (Backend::prepare_moe); nullptr otherwise.
  const kernels::MoeKernelPlan* kernel_plan = nullptr;
  int64_t first_expert = 0;    // global id of local expert 0 (expert parallelism; 0 otherwise)
  int64_t global_experts = 0;  // the layer's routed experts over all ranks; 0 = n_experts() (not partitioned)
  int64_t n_experts() const { return gate_up.dim(0); }
  bool partitioned() const { return global_experts != 0 && global_experts != n_experts(); }
  int64_t inter() const { return gate_up.dim(1) / 2; }
};

// Kernel choices a backend exposes to tests and benchmarks (serving never needs them; the defaults are the
// tuned / heuristic choice). A backend without the named choice refuses it (set_kernel_options).
struct KernelOptions {
  std::string attention_kernel;        // "" = the planner's choice; CUDA: "simt" | "warp" | "shared" | "wgmma_ws"
  int64_t attention_split_target = 0;  // CUDA: > 0 = warps per SM the decode attention's context split aims for
  // CUDA, the wgmma prefill kernel over an FP8 KV cache: "" = dequantize the step's context once into a bf16
  // scratch where it fits (kv_fp8_dequant_once.cu), "fused" = the kernel's producer dequantizes per q-head block.
  std::string attention_fp8_prefill;
  std::string moe_kernel;              // "" = by token count; CUDA: "grouped" forces the bf16 grouped GEMM (benchmarks),
                                       // "prefill_dequant" the MXFP4 dequantize-then-bf16-GEMM prefill path (>= 1024 tokens)
  // "" or "bf16" = bf16 activations (W4A16); CUDA: "fp8_e4m3" = W4A8 on the MXFP4 experts' wgmma prefill GEMMs
  // (per-token FP8 activations, opt-in: `--moe-activation-dtype`; its accuracy gate: eval/moe_activation_gate.h).
  std::string moe_activation_dtype;
  // CUDA: false turns the shared-prefix (cascade) decode attention off (`--disable-cascade-attention`); the CPU
  // backend never runs it, so the option is not part of is_default (a no-op there).
  bool cascade_attention = true;
  int64_t cascade_min_saved_bytes = kernels::kCascadeMinSavedBytes;  // tests: 0 (every group pays)
  bool fp8_moe_activations() const { return moe_activation_dtype == "fp8_e4m3"; }
  bool is_default() const {
    return attention_kernel.empty() && attention_split_target == 0 && attention_fp8_prefill.empty() &&
           moe_kernel.empty() &&
           (moe_activation_dtype.empty() || moe_activation_dtype == "bf16");
  }
};

// Typed construction options of a backend (the launch root fills them from its rank layout and flags).
struct BackendOptions {
  int device = 0;  // the accelerator this backend runs on (CUDA device index; ignored by the CPU backend)
  KernelOptions kernels;
};

// A captured sequence of device work (a CUDA graph), replayed on the backend's stream.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;  // f32 on CPU, bf16 on CUDA
  virtual DType weight_dtype() const = 0;      // dtype float weights are stored in on this backend
  // Replaces the kernel choices (KernelOptions); an option this backend does not have is an error naming it.
  virtual Status set_kernel_options(const KernelOptions& options) {
    if (options.is_default()) return Status::ok();
    return unsupported("backend " + name() + " has no kernel options (attention_kernel '" + options.attention_kernel +
                       "', attention_split_target " + std::to_string(options.attention_split_target) +
                       ", attention_fp8_prefill '" + options.attention_fp8_prefill + "', moe_kernel '" +
                       options.moe_kernel + "', moe_activation_dtype '" + options.moe_activation_dtype + "')");
  }
  // Cascade (shared-prefix) decode attention for AttentionMeta::cascade: < 0 = off (the batch builder detects
  // no prefix groups); else the K/V bytes per layer an eager batch's groups must save to take it (decode
  // graphs always encode their groups). CUDA: KernelOptions::cascade_attention / cascade_min_saved_bytes.
  virtual int64_t cascade_attention_min_saved_bytes() const { return -1; }
  bool cascade_attention_enabled() const { return cascade_attention_min_saved_bytes() >= 0; }
  // Whether moe_experts() runs experts stored in format f directly (else the loader dequantizes to kFloat).
  virtual bool supports_expert_format(ExpertFormat f) const { return f == ExpertFormat::kFloat; }
  // Called once per MoE layer after its experts are loaded: a backend with tuned kernel selection builds the
  // shape's kernel plan here (experts.kernel_plan), so its chosen configs (or the missing-table warning) are
  // logged at start-up and moe_experts picks its kernels without a lookup by name.
  virtual void prepare_moe(ExpertWeights& experts, int64_t top_k) {}
  // The MoE kernel configurations chosen so far, per shape and token-count bucket (the start-up log and
  // the mxserve:moe_kernel_config gauge); empty on a backend without tuned selection. Thread-safe.
  virtual std::vector<kernels::MoeKernelConfigRow> moe_kernel_configs() const { return {}; }

  // ---- memory ----
  virtual Tensor alloc(DType dtype, Shape shape) = 0;
  // Copies a host tensor into dst (same shape), converting float weights to dst's dtype.
  virtual void copy_weight(const Tensor& host, Tensor& dst) = 0;
  // Exact copies (ids, metadata, logits).
  virtual Tensor upload(const Tensor& host) = 0;
  virtual Tensor to_host(const Tensor& t) = 0;  // f32 for float tensors
  // Copies the host tensor's bytes into dst's flat elements [offset, offset + host.numel()) (same dtype), in
  // stream order; the host tensor may be freed on return. Small updates of persistent device tables.
  virtual void write_from_host(Tensor& dst, int64_t offset, const Tensor& host);
  virtual void synchronize() {}
  // Runs `body` once eagerly, then captures what it enqueues into a graph (decode steps). While either runs,
  // temporaries come from a memory pool private to this backend's graphs (alive while any graph is), and
  // host<->device copies are refused: inputs must sit in device buffers the caller keeps alive.
  virtual Result<std::unique_ptr<DeviceGraph>> capture_graph(const std::function<void()>& body) {
    return unsupported("backend " + name() + " cannot capture graphs");
  }
  // Frees the graphs' private pool when no graph of this backend is left to use it (the capture failed before
  // any was kept: runtime/decode_graphs.h). The caller knows that no graph captured with this backend's part
  // -- a joined capture's other ranks included -- is alive.
  virtual void release_graph_pool() {}

  // ---- ops ----
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;        // [V,H], i32[T] -> [T,H]
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;     // [R,C] (out may be x)
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) = 0;  // [M,K]x[N,K]^T
  virtual void rope(Tensor& x, const Tensor& positions, const kernels::RopeParams& p) = 0;  // [T,nh,hd] in place
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;                          // [T,2I] -> [T,I]
  virtual void add(Tensor& x, const Tensor& y) = 0;                                       // x += y
  // residual += x; out = rmsnorm(residual) * w (rows of w.numel()): the tp == 1 seam between a layer's halves.
  // Bit for bit add then rmsnorm (the residual rounded to its dtype first); out may alias x, not residual.
  // The default is those two ops; a backend overrides it with one fused kernel.
  virtual void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& w, float eps, Tensor& out) {
    add(residual, x);
    rmsnorm(residual, w, eps, out);
  }
  virtual void kv_write(const Tensor& k, const Tensor& v, const AttentionMeta& meta, Tensor& k_cache,
                        Tensor& v_cache) = 0;
  // After GQA's one QKV GEMM: y [T, nq + 2 nkv] = q | k | v columns (nq = p.n_heads * p.head_dim, nkv =
  // meta.params.n_kv_heads * p.head_dim, contiguous). Returns q [T, nq] roped (contiguous; at T == 1 possibly a
  // view of y, whose q | k columns this may overwrite); writes k roped (p, with n_kv_heads heads) and v into the
  // caches as kv_write(k, v, meta, ...) does. Bit for bit: copy the columns out, rope(q), rope(k), kv_write --
  // the default (it uploads a column index, so not inside capture_graph); a backend overrides it with one kernel.
  virtual Tensor rope_kv_write(Tensor& y, const Tensor& positions, const kernels::RopeParams& p,
                               const AttentionMeta& meta, Tensor& k_cache, Tensor& v_cache);
  // Whether GQA attention of `rows` rows takes the one QKV GEMM + rope_kv_write path (else: q / k / v GEMMs, or
  // views of the one GEMM at one row, then rope, rope, kv_write). A backend keeps its proven path until its
  // fused one is (CUDA: kFusedRopeKvDefault / MXSERVE_FUSED_ROPE_KV).
  virtual bool one_qkv_gemm(int64_t rows) const {
    (void)rows;
    return true;
  }
  // Copies cache rows src_slots[i] -> dst_slots[i] (i32 [P], on the backend) in every tensor of `caches`
  // (each [n_slots, width]: whatever the model's cache layout holds -- K and V, a latent, indexer keys,
  // scales), in order i = 0..P-1 per tensor (a later pair may read a slot an earlier one wrote): compaction
  // of an accepted tree path. (Not pure: a backend without it -- e.g. a test double -- fails loudly when
  // tree speculation asks.)
  virtual void kv_copy(const Tensor& src_slots, const Tensor& dst_slots, const std::vector<Tensor*>& caches);
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMeta& meta,
                         Tensor& out) = 0;                                                // [T,nh,hd]
  // Router GEMM in fp32 + sigmoid + group-limited top-k: x [T,H], gate_w [E,H], bias f32 [E].
  virtual void router(const Tensor& x, const Tensor& gate_w, const Tensor& bias, const kernels::RouterParams& p,
                      Tensor& topk_ids, Tensor& topk_weights) = 0;                         // i32/f32 [T,K]
  // out [T,H] += sum_k weights[t,k] * Expert_{ids[t,k]}(x[t]) over the experts this rank holds: ids are global
  // (the router's), an id outside [first_expert, first_expert + n_experts()) adds nothing (expert parallel:
  // another rank adds it). A backend that cannot skip foreign ids refuses partitioned() experts loudly.
  virtual void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                           const ExpertWeights& experts, Tensor& out) = 0;
  virtual void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) = 0;          // out[r] = x[rows[r]]
  // Greedy token per row: out i32 [R] = argmax over f32 logits [R, V], ties to the lowest index.
  virtual void argmax_rows(const Tensor& logits, Tensor& out) = 0;
  // Samples one token per in.rows entry from f32 logits [R, V] on this backend with runtime/sampler.h's
  // semantics (kernels/sampling_params.h; the CPU backend runs the CPU sampler itself). Host in, host out:
  // one upload of the row parameters + sparse bias/penalty data, one download of ids, logprobs and per-row
  // error codes (a NaN row is an error code, never a crash). Waits for the result. (Not pure: a backend
  // without it -- e.g. a test double -- fails loudly when asked.)
  virtual std::vector<kernels::SampledRow> sample_rows(const Tensor& logits, const kernels::SampleRowsInput& in);
  // Synthetic weights generated in place (kernels/synthetic_fill.h: the same bits on every backend).
  // kNormal / kMxfp4Dequant: dst float [p.rows, p.cols] (f32 or bf16); kMxfp4: dst u8 packed codes
  // [p.rows, p.cols/2] and *scales u8 [p.rows, p.cols/32] (p.cols % 32 == 0, whole rows).
  virtual void fill_synthetic(const kernels::SyntheticFill& p, Tensor& dst, Tensor* scales) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();
// nullptr + a Status naming why when CUDA is not built in, no GPU is present or the device does not exist.
Result<std::unique_ptr<Backend>> make_backend(const std::string& name, const BackendOptions& options = {});

}  // namespace mxserve::backend
