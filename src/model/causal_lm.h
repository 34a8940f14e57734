// CausalLM: what the runtime and the CLI see of a model -- one forward over a ForwardBatch against a
// paged KV cache, plus the MTP (NextN) draft forward when the checkpoint has one.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/weight_table.h"
#include "parallel/communicator.h"

namespace mxserve::parallel {
class FusedAddNorm;
}  // namespace mxserve::parallel

namespace mxserve::model {

struct ForwardOutput {
  Tensor logits;  // [len(logit_rows), V] on the backend's device (f32 on CPU)
  Tensor hidden;  // [T, H] post-final-norm hidden states when batch.want_hidden (MTP input)
};

// One part of a decoder layer, for per-layer benchmarks (mxserve bench-model).
enum class LayerPart {
  kAttention,  // input RMSNorm, q/k/v (+bias, q/k norm), RoPE, KV write, paged attention, o_proj, residual add
  kMlp,        // post-attention RMSNorm, dense MLP or MoE (router + shared + routed experts), residual add
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;
  // The KV cache geometry this model needs (target layers + the MTP layer, if any).
  virtual kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const = 0;
  // The cache element type kv_spec lays out (LoadOptions::kv_cache_dtype; set once, before any cache exists).
  // An architecture without an FP8 layout refuses it, naming the dtype.
  virtual Status set_kv_cache_dtype(kvcache::KvCacheDtype dtype) {
    if (dtype == kvcache::KvCacheDtype::kAuto) return Status::ok();
    return unsupported(std::string("--kv-cache-dtype ") + kvcache::kv_cache_dtype_name(dtype) +
                       " is not implemented for this architecture");
  }
  virtual kvcache::KvCacheDtype kv_cache_dtype() const { return kvcache::KvCacheDtype::kAuto; }
  virtual Result<ForwardOutput> forward(const ForwardBatch& batch, kvcache::KvCache& kv) = 0;
  // Decode graphs: the target forward over inputs already on the backend (ids, positions i32 [T]; meta with
  // T rows, its shape fields -- heads, head_dim, scale -- filled here), logits of every row into logits
  // (f32 [T, V], on the backend) and, when hidden is given ([T, H] in the activation dtype), the post-final-norm
  // hidden state of every row (the MTP layer's input; speculative verify steps). Rows may be several per
  // sequence (a chain verify step: x_last and the drafts, KV indices consecutive). Enqueues no host<->device
  // copy, so Backend::capture_graph can take it.
  virtual Status forward_device(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                                kvcache::KvCache& kv, Tensor& logits, Tensor* hidden = nullptr) {
    return unsupported("this model has no device-input forward (decode graphs)");
  }
  // How the decode / MTP graphs (runtime/decode_graphs.h, mtp_graphs.h) capture `body` and replay what it made.
  // One backend: be.capture_graph(body) and DeviceGraph::replay. A model spread over ranks on several GPUs
  // (launch/lockstep_model.h) captures one graph per rank on the ranks' own threads and replays them together;
  // its replay's error (a rank's launch failing) fails the step, naming the rank.
  virtual Result<std::unique_ptr<backend::DeviceGraph>> capture_device_graph(backend::Backend& be,
                                                                             const std::function<void()>& body) {
    return be.capture_graph(body);
  }
  // Whether capture_device_graph records the body's one forward_device instead of running it (per-rank graphs
  // of NCCL ranks): the body must then enqueue nothing else (decode graphs leave their sampling tail out).
  virtual bool records_graph_body() { return false; }
  // No graph captured through capture_device_graph is alive (the decode graphs are off): frees the graphs'
  // private pools -- be's, and every rank's where the model spreads over ranks.
  virtual void release_graph_pools(backend::Backend& be) { be.release_graph_pool(); }
  virtual Status replay_device_graph(backend::DeviceGraph& graph) {
    graph.replay();
    return Status::ok();
  }
  // Decode graphs under data parallelism: forward_device's T rows are this many equal slot ranges, range g
  // holding DP group g's rows (runtime/dp_graph_rows.h stages them, launch/dp_graph_step.h runs each group on
  // its range). 1: the rows are one batch.
  virtual int device_row_groups() const { return 1; }
  // MTP graphs (runtime/mtp_graphs.h): one MTP forward over inputs already on the backend -- ids, positions,
  // hidden_in [T, H], meta for T rows -- into logits f32 [T, V] and hidden_out [T, H] (the MTP layer's output
  // hidden state). `rows` says what the rows are:
  //   kChainContinuation: draft-chain steps >= 2 (ids: each row's previous draft, hidden_in: the previous MTP
  //     step's output); every row continues the chain whose first step was the latest MTP extend, and what it
  //     reuses from that step was staged by stage_mtp_chain;
  //   kExtend: the MTP extend (the chain's first step: every position the target just computed); logits may be
  //     undefined (no head: the caller runs lm_head_device over the rows it wants); what later continuation
  //     steps reuse goes to persistent buffers (reserve_mtp_extend), made current by commit_mtp_extend;
  //   kTree: tree draft steps (meta carries the tree mask / base); nothing is reused or kept.
  // Enqueues no host<->device copy.
  enum class MtpDeviceRows { kChainContinuation, kExtend, kTree };
  virtual Status forward_mtp_device(const Tensor& ids, const Tensor& positions, const Tensor& hidden_in,
                                    const backend::AttentionMeta& meta, kvcache::KvCache& kv, Tensor& logits,
                                    Tensor& hidden_out, MtpDeviceRows rows = MtpDeviceRows::kChainContinuation) {
    return unsupported("this model has no device-input MTP forward (MTP graphs)");
  }
  // MTP graphs: logits f32 [R, V] = lm_head(hidden [R, H]) (the MTP head over rows of an extend's hidden_out).
  virtual Status lm_head_device(const Tensor& hidden, Tensor& logits) {
    return unsupported("this model has no device-input MTP head (MTP graphs)");
  }
  // Eager, once before capturing kExtend bodies of up to max_rows rows (glm_moe_dsa with
  // index_share_for_mtp_iteration: the persistent first-step top-k buffer the extend graphs write).
  virtual Status reserve_mtp_extend(int64_t max_rows) { return Status::ok(); }
  // Eager, after each kExtend replay over n_rows real rows (compact, the batch's order): what the extend kept
  // becomes the chain state later steps reuse, as an eager forward_mtp extend leaves it.
  virtual Status commit_mtp_extend(int64_t n_rows) { return Status::ok(); }
  // Eager, once before capturing forward_mtp_device bodies of up to max_rows rows: allocates the persistent
  // buffers the continuation steps read (glm_moe_dsa: the staged first-step DSA top-k).
  virtual Status reserve_mtp_chain(int64_t max_rows) { return Status::ok(); }
  // Eager, before each replay: stages what continuation rows reuse from the chain's first step (glm_moe_dsa
  // with index_share_for_mtp_iteration: the first step's top-k rows step.first_step_rows, whose device copy is
  // first_step_rows i32 [n], into the persistent buffer's rows [0, n)). Errors name mtp_first_step_rows.
  virtual Status stage_mtp_chain(const MtpStep& step, const Tensor& first_step_rows) { return Status::ok(); }
  virtual bool has_mtp() const = 0;
  // MTP draft forward: token_ids are the *next* tokens x_{t+1}; hidden_in [T,H] the target's post-norm
  // hidden states h_t (or the draft's own output); positions are the target's. Own KV layer.
  // Returns logits of batch.logit_rows and (if want_hidden) the draft's output hidden states.
  virtual Result<ForwardOutput> forward_mtp(const ForwardBatch& batch, const Tensor& hidden_in,
                                            kvcache::KvCache& kv) = 0;
  // Copies cache slots src_slots[i] -> dst_slots[i] (i32 [P] on be) in every tensor of kv's layout, pairs in
  // order (tree-speculation compaction). A model spread over ranks copies in every rank's cache.
  virtual void copy_kv_slots(backend::Backend& be, const Tensor& src_slots, const Tensor& dst_slots,
                             kvcache::KvCache& kv) {
    be.kv_copy(src_slots, dst_slots, kv.all_tensors());
  }
  // Benchmarks: binds one part of decoder layer `layer` to a batch (its metadata uploaded once, here) and
  // returns a closure that runs x += part(norm(x)) on x [T, H] in the activation dtype, enqueueing backend
  // work without synchronizing. The closure references kv and this model: it must not outlive them.
  virtual Result<std::function<void(Tensor& x)>> bind_layer_part(int64_t layer, LayerPart part,
                                                                  const ForwardBatch& batch, kvcache::KvCache& kv) {
    (void)layer, (void)part, (void)batch, (void)kv;
    return unsupported("bind_layer_part: not implemented for this model");
  }
};

struct LoadOptions {
  bool load_mtp = true;             // bind and load the MTP layer when the config declares one
  bool synthetic = false;           // deterministic random weights from the config alone (no checkpoint)
  uint64_t seed = 0;                // synthetic weights' seed
  int64_t num_layers_override = 0;  // > 0: keep only the first N decoder layers (truncated model)
  std::string synthetic_quantization;  // synthetic weights' precision plan: "", "mxfp4", "fp8-block" (experts)
  kvcache::KvCacheDtype kv_cache_dtype = kvcache::KvCacheDtype::kAuto;  // --kv-cache-dtype
  parallel::RankLayout rank;                // the rank loaded for: each weight sliced per its shard axis
  parallel::Communicator* comm = nullptr;   // its tp group's collectives (nullptr: one rank)
  parallel::Communicator* moe_comm = nullptr;  // DP attention: the world its MoE blocks exchange tokens over
  parallel::FusedAddNorm* fused_add_norm = nullptr;  // tp > 1: the fused all-reduce + add + RMSNorm (or none)
};

// config.json at `path` with the options applied (num_layers_override truncates; errors name the flag).
Result<ModelConfig> resolve_model_config(const std::string& path, const LoadOptions& options);
// What an architecture's load code declares: the weight table (name, shape, precisions, shard axis of
// every weight, in load order) and the checkpoint tensors it leaves unused (plus cfg's quantization_config).
struct DeclaredWeights {
  std::vector<WeightSpec> table;
  BindOptions bind;
};
// Runs arch.build against a recording loader (model/layers/weight_loader.h): nothing is read or allocated.
DeclaredWeights record_weights(const ArchitectureDef& arch, const ModelConfig& cfg, bool include_mtp);

// Every weight the architecture declares for cfg (the MTP layer's when include_mtp), with shapes,
// precisions and shard axes: what a loader binds, and what parameter / byte accounting counts.
std::vector<WeightSpec> declared_weights(const ModelConfig& cfg, bool include_mtp);

// Reads config.json + the checkpoint in dir, validates every tensor, uploads weights to the backend.
// With options.synthetic, `path` is a config.json (or a directory holding one) and no checkpoint is read.
Result<std::unique_ptr<CausalLM>> load_causal_lm(const std::string& path, backend::Backend& be,
                                                 const LoadOptions& options);

}  // namespace mxserve::model
