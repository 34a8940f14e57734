// DecoderFrame: the frame every registered decoder-only MoE architecture fills in (glm4_moe, glm_moe_dsa):
//   x = embed[ids]; per layer l: x += attn_l(rmsnorm(x)); x += (dense MLP | MoE)_l(rmsnorm(x));
//   logits = lm_head(rmsnorm(x)).  MTP layer L = n_layers:
//   y = shared_head.norm(Layer_L(eh_proj(cat(enorm(embed(x_{t+1})), hnorm(h_t))))), logits = lm_head(y).
// The frame owns what does not depend on the attention: the weight declaration of norms, MLP / MoE blocks,
// the vocabulary and the MTP head; the layer loop; the batch / KV-geometry check; the batch upload; the
// collectives around each half ("TP:" all-reduce after attention and MLP, "DP:" the MoE exchange and the
// idle forward of a DP group without tokens: model/layers/dp_moe.h); the bench-model layer parts.
// An architecture supplies its attention (a type with its own load / forward), the attention metadata shape,
// its KV layout (CausalLM::kv_spec) and, through State, what one forward carries from layer to layer (e.g.
// glm_moe_dsa's DSA top-k); see glm4_moe.cpp and glm_moe_dsa.cpp.
// Invariant: the per-layer order of weight declarations, allocations and collectives is the same for every
// architecture (input norm, post norm, attention, MLP; attention half then MLP half).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/check.h"
#include "kvcache/layer_load_gate.h"
#include "model/causal_lm.h"
#include "model/layers/blocks.h"
#include "model/layers/dp_moe.h"
#include "model/layers/tensor_parallel.h"
#include "model/layers/weight_decl.h"
#include "model/layers/weight_loader.h"

namespace mxserve::model {

// HF checkpoint prefix of decoder layer l ("model.layers.<l>."; the MTP layer is l = n_layers).
std::string decoder_layer_prefix(int64_t l);

// The MLP half of a decoder layer: a dense SwiGLU MLP or a MoE block.
using DecoderMlp = std::variant<SwigluMlp, MoeBlock>;

// The MTP layer's own tensors around its decoder block.
struct MtpHead {
  Tensor enorm, hnorm, shared_head_norm;  // [H]
  Tensor eh_proj_e, eh_proj_h;            // eh_proj [H, 2H] split into its embedding / hidden halves
};

// Everything of the frame that does not depend on the attention type.
class DecoderFrameBase : public CausalLM {
 public:
  const ModelConfig& config() const override { return cfg_; }

 protected:
  // comm: the tensor-parallel group (nullptr: one rank; a one-rank world's communicator given anyway runs
  // every collective as the identity: the launch's NCCL one-rank test switch). moe_comm: the world the MoE
  // blocks exchange tokens over under DP attention (used only when rank.dp_attention).
  DecoderFrameBase(const ModelConfig& cfg, backend::Backend& be, const parallel::RankLayout& rank,
                   parallel::Communicator* comm, parallel::Communicator* moe_comm);

  struct Uploaded {
    Tensor ids, positions;  // i32 [T] on the backend
    backend::AttentionMeta meta;
  };

  // The attention metadata's shape fields (heads, head_dim, scale) of this architecture on this rank.
  virtual void attention_shape(kernels::AttentionParams& ap) const = 0;

  // The KV cache holds at least the layers kv_spec declares, each tensor with the declared width and dtype,
  // and the batch fits it (ForwardBatch::validate).
  Status check_batch(const ForwardBatch& batch, kvcache::KvCache& kv) const;
  Result<Uploaded> upload_batch(const ForwardBatch& batch, kvcache::KvCache& kv);
  // bind_layer_part's shared checks: the batch, DP attention off, the layer index.
  Status check_bound_part(int64_t layer, const ForwardBatch& batch, kvcache::KvCache& kv) const;
  // The vocabulary and the final norm (declared first, in this order).
  void load_head(WeightLoader& wl);
  // The dense MLP or MoE block of layer l (moe: cfg.is_moe_layer(l), true for the MTP layer).
  DecoderMlp load_mlp(WeightLoader& wl, const std::string& prefix, bool moe);
  // The MTP layer's tensors before its decoder block (its optional head / embedding copies declared unused).
  MtpHead load_mtp_head(WeightLoader& wl);
  // MTP layers the config declares but the caller chose not to load.
  void ignore_mtp_layers(WeightLoader& wl);
  // x [T, H] = eh_proj(cat(enorm(embed(ids)), hnorm(hidden_in))) (hidden_in [T, H], checked by the caller).
  Result<Tensor> mtp_input(const MtpHead& m, const Tensor& ids, const Tensor& hidden_in);
  // x += mlp(rmsnorm(x, post_norm)): this rank's partial sum summed over the tp group, or the DP exchange.
  Status mlp_half(const Tensor& post_norm, const DecoderMlp& mlp, Tensor& x);
  // DP attention, no tokens for this DP group this step: joins every block's MoE exchange with 0 rows.
  Result<ForwardOutput> idle_forward(const std::vector<const MoeBlock*>& blocks);

  ModelConfig cfg_;
  ModelConfig attn_cfg_;  // cfg_ with this rank's head counts (tensor parallel; set by the architecture)
  backend::Backend& be_;
  TensorParallel tp_;     // the vocabulary-parallel embedding / head and the group's collectives
  DpMoeExchange dp_moe_;  // DP attention's MoE exchange (disabled otherwise)
  Tensor final_norm_;     // [H]
};

// Attention: the architecture's attention block (its weights). State: what one forward pass (or one bound
// layer part) carries from layer to layer; std::monostate when nothing. The architecture implements:
//   Attention load_attention(WeightLoader&, const std::string& prefix, int64_t layer)  (layer n_layers: MTP)
//   Status attend(...)  the attention half up to o (before the tp all-reduce the frame runs)
//   and CausalLM::kv_spec, DecoderFrameBase::attention_shape.
template <typename Attention, typename State = std::monostate>
class DecoderFrame : public DecoderFrameBase {
 public:
  struct Layer {
    Tensor input_norm, post_norm;  // [H]
    Attention attn;
    DecoderMlp mlp;
  };
  struct MtpLayer {
    MtpHead head;
    Layer block;
  };

  // Binds (or, on a recording loader, declares) every weight; names the checkpoint tensors left unused.
  Status load(WeightLoader& wl, bool include_mtp) {
    load_head(wl);  // TP: embed_tokens / lm_head, this rank's vocabulary rows; the final norm
    for (int64_t l = 0; l < cfg_.n_layers; ++l) layers_.push_back(load_layer(wl, l, cfg_.is_moe_layer(l)));
    if (include_mtp) {
      MtpLayer m;
      m.head = load_mtp_head(wl);
      m.block = load_layer(wl, cfg_.n_layers, /*moe=*/true);
      mtp_ = std::move(m);
    } else {
      ignore_mtp_layers(wl);
    }
    return Status::ok();
  }

  bool has_mtp() const override { return mtp_.has_value(); }

  Result<ForwardOutput> forward(const ForwardBatch& batch, kvcache::KvCache& kv) override {
    if (batch.n_tokens() == 0 && dp_moe_.enabled()) return idle_forward(moe_blocks(/*mtp=*/false));
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    const int64_t T = batch.n_tokens();
    MX_ASSIGN_OR_RETURN(Uploaded up, upload_batch(batch, kv));
    Tensor x = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    MX_RETURN_IF_ERROR(tp_.embed(up.ids, x));  // TP: each token's row came from one rank, zeros from the others
    State state = make_state(T, /*bound_part=*/false);
    // Chained: each layer's MLP (all-reduce +) add + the next RMSNorm in one call (TP fused, or add_rmsnorm).
    Tensor h = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    if (cfg_.n_layers > 0) be_.rmsnorm(x, layers_[0].input_norm, static_cast<float>(cfg_.rms_norm_eps), h);
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const Tensor& next = l + 1 < cfg_.n_layers ? layers_[l + 1].input_norm : final_norm_;
      MX_RETURN_IF_ERROR(run_layer(layers_[l], x, up.positions, up.meta, kv, l, state, &h, &next));
    }
    if (cfg_.n_layers == 0) be_.rmsnorm(x, final_norm_, static_cast<float>(cfg_.rms_norm_eps), h);
    MX_RETURN_IF_ERROR(tp_.check_fused());  // a peer barrier that gave up fails the step, naming the rank
    return tp_.head(batch, h);  // h = rmsnorm(x, final_norm)
  }

  Result<ForwardOutput> forward_mtp(const ForwardBatch& batch, const Tensor& hidden_in,
                                    kvcache::KvCache& kv) override {
    if (!mtp_) return unsupported("this model was loaded without an MTP layer");
    if (batch.n_tokens() == 0 && dp_moe_.enabled()) return idle_forward(moe_blocks(/*mtp=*/true));
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    const int64_t T = batch.n_tokens();
    if (hidden_in.ndim() != 2 || hidden_in.dim(0) != T || hidden_in.dim(1) != cfg_.d_model)
      return invalid_argument("forward_mtp: hidden_in is " + hidden_in.describe() + ", expected [" +
                              std::to_string(T) + ", " + std::to_string(cfg_.d_model) + "]");
    MX_ASSIGN_OR_RETURN(Uploaded up, upload_batch(batch, kv));
    MX_ASSIGN_OR_RETURN(Tensor x, mtp_input(mtp_->head, up.ids, hidden_in));
    State state = make_state(T, /*bound_part=*/false);
    MX_RETURN_IF_ERROR(begin_mtp(batch, state));
    // Chained: the MLP (all-reduce +) add + shared_head.norm in one call (TP fused, or add_rmsnorm).
    Tensor h = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    be_.rmsnorm(x, mtp_->block.input_norm, static_cast<float>(cfg_.rms_norm_eps), h);
    MX_RETURN_IF_ERROR(run_layer(mtp_->block, x, up.positions, up.meta, kv, cfg_.n_layers, state, &h,
                                 &mtp_->head.shared_head_norm));
    end_mtp(state);
    MX_RETURN_IF_ERROR(tp_.check_fused());
    return tp_.head(batch, h);
  }

  // MTP graphs: forward_mtp's body over inputs already on the device (CausalLM::forward_mtp_device): chain
  // continuation rows, the extend (logits undefined: no head) or tree draft rows (meta's tree mask). The
  // per-chain state the architecture reuses or keeps comes from begin_mtp_device (persistent buffers, staged
  // eagerly by stage_mtp_chain / made current by commit_mtp_extend), never from a host upload. One rank only
  // (collectives with host barriers are not capturable).
  Status forward_mtp_device(const Tensor& ids, const Tensor& positions, const Tensor& hidden_in,
                            const backend::AttentionMeta& device_meta, kvcache::KvCache& kv, Tensor& logits,
                            Tensor& hidden_out, MtpDeviceRows rows = MtpDeviceRows::kChainContinuation) override {
    if (!mtp_) return unsupported("this model was loaded without an MTP layer");
    if (tp_.splits() || dp_moe_.enabled())
      return unsupported("forward_mtp_device (MTP graph capture) with tensor parallelism or DP attention");
    const int64_t T = ids.numel(), H = cfg_.d_model;
    auto rows_of = [&](const Tensor& t, int64_t w) { return t.ndim() == 2 && t.dim(0) == T && t.dim(1) == w; };
    const bool tree = device_meta.params.tree_mask != nullptr;
    const bool head = logits.ndim() != 0;
    if (positions.numel() != T || device_meta.params.n_tokens != T || tree != (rows == MtpDeviceRows::kTree) ||
        device_meta.params.max_kv_len <= 0 || !rows_of(hidden_in, H) || !rows_of(hidden_out, H) ||
        (head && (!rows_of(logits, cfg_.vocab_size) || logits.dtype() != DType::kF32)) ||
        (!head && rows != MtpDeviceRows::kExtend))
      return invalid_argument("forward_mtp_device: " + std::to_string(T) + " ids, " +
                              std::to_string(positions.numel()) + " positions, attention metadata for " +
                              std::to_string(device_meta.params.n_tokens) + " rows (max_kv_len " +
                              std::to_string(device_meta.params.max_kv_len) + (tree ? ", tree rows" : "") +
                              "), hidden_in " + hidden_in.describe() + ", hidden_out " + hidden_out.describe() +
                              ", logits " + logits.describe() +
                              " (chain / extend rows without a tree mask, tree rows with one, a context bound, and "
                              "logits except for an extend expected)");
    backend::AttentionMeta meta = device_meta;
    attention_shape(meta.params);
    MX_ASSIGN_OR_RETURN(Tensor x, mtp_input(mtp_->head, ids, hidden_in));
    State state = make_state(T, /*bound_part=*/false);
    MX_RETURN_IF_ERROR(begin_mtp_device(T, rows, state));
    MX_RETURN_IF_ERROR(run_layer(mtp_->block, x, positions, meta, kv, cfg_.n_layers, state));
    be_.rmsnorm(x, mtp_->head.shared_head_norm, static_cast<float>(cfg_.rms_norm_eps), hidden_out);
    if (head) be_.linear(hidden_out, tp_.lm_head(), nullptr, logits);
    return Status::ok();
  }
  Status lm_head_device(const Tensor& hidden, Tensor& logits) override {
    if (tp_.splits() || dp_moe_.enabled())
      return unsupported("lm_head_device (MTP graph capture) with tensor parallelism or DP attention");
    if (hidden.ndim() != 2 || hidden.dim(1) != cfg_.d_model || logits.ndim() != 2 || logits.dim(0) != hidden.dim(0) ||
        logits.dim(1) != cfg_.vocab_size || logits.dtype() != DType::kF32)
      return invalid_argument("lm_head_device: hidden " + hidden.describe() + ", logits " + logits.describe());
    be_.linear(hidden, tp_.lm_head(), nullptr, logits);
    return Status::ok();
  }

  // bench-model hook: the attention half or the MLP half of one layer, as run_layer does them. The state
  // (e.g. a top-k a shared-indexer layer reads) is the closure's own.
  Result<std::function<void(Tensor&)>> bind_layer_part(int64_t layer, LayerPart part, const ForwardBatch& batch,
                                                       kvcache::KvCache& kv) override {
    MX_RETURN_IF_ERROR(check_bound_part(layer, batch, kv));
    MX_ASSIGN_OR_RETURN(Uploaded uploaded, upload_batch(batch, kv));
    auto up = std::make_shared<Uploaded>(std::move(uploaded));
    auto state = std::make_shared<State>(make_state(batch.n_tokens(), /*bound_part=*/true));
    const Layer* L = &layers_[layer];
    if (part == LayerPart::kAttention) {
      return std::function<void(Tensor&)>([this, up, state, L, layer, &kv](Tensor& x) {
        Tensor h = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
        Tensor o = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
        be_.rmsnorm(x, L->input_norm, static_cast<float>(cfg_.rms_norm_eps), h);
        if (kvcache::LayerLoadGate* gate = kv.load_gate())
          MX_CHECK_MSG(gate->wait(layer).is_ok(), "bind_layer_part: host-tier load failed");
        MX_CHECK_MSG(attend(L->attn, h, up->positions, up->meta, kv, layer, *state, o).is_ok(),
                     "bind_layer_part: attention failed");
        MX_CHECK_MSG(tp_.reduce_partial(o).is_ok(), "bind_layer_part: all-reduce failed");
        be_.add(x, o);
      });
    }
    return std::function<void(Tensor&)>([this, L](Tensor& x) {
      MX_CHECK_MSG(mlp_half(L->post_norm, L->mlp, x).is_ok(), "bind_layer_part: MLP failed");
    });
  }

 protected:
  using DecoderFrameBase::DecoderFrameBase;

  // forward_device's body after the arch's checks (CUDA graphs; any tp, no host<->device copy): the embedding of
  // device ids, the layer stack (chained norms, as forward), the final norm into `hidden`
  // when given, the logits of every row (gathered along the vocabulary at tp > 1). No check_fused(): it
  // synchronizes the stream (the event-ordered stand-in path has nothing to check; the peer path's error word
  // is read by the next eager step's check).
  Status device_body(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                     kvcache::KvCache& kv, State& state, Tensor& logits, Tensor* hidden) {
    const int64_t T = ids.numel();
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    Tensor x = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    MX_RETURN_IF_ERROR(tp_.embed_device(ids, x));
    Tensor normed = hidden != nullptr ? *hidden : be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    // Chained: each layer's MLP (all-reduce +) add + the next RMSNorm in one call (TP fused, or add_rmsnorm);
    // `normed` ends as rmsnorm(x, final_norm): the post-norm hidden rows (speculation's MTP input).
    if (cfg_.n_layers > 0) be_.rmsnorm(x, layers_[0].input_norm, eps, normed);
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const Tensor& next = l + 1 < cfg_.n_layers ? layers_[l + 1].input_norm : final_norm_;
      MX_RETURN_IF_ERROR(run_layer(layers_[l], x, positions, meta, kv, l, state, &normed, &next));
    }
    if (cfg_.n_layers == 0) be_.rmsnorm(x, final_norm_, eps, normed);
    return tp_.head_device(normed, logits);
  }

  virtual Attention load_attention(WeightLoader& wl, const std::string& prefix, int64_t layer) = 0;
  // h = rmsnorm(x) [T, H] -> o [T, H], this rank's partial sum over its heads (the frame all-reduces it).
  virtual Status attend(const Attention& attn, const Tensor& h, const Tensor& positions,
                        const backend::AttentionMeta& meta, kvcache::KvCache& kv, int64_t cache_layer, State& state,
                        Tensor& o) = 0;
  // A forward's (bound_part: one bench-model layer part's) state over T rows, made after the embedding.
  virtual State make_state(int64_t T, bool bound_part) {
    (void)T, (void)bound_part;
    return State{};
  }
  // forward_mtp around its one layer: before it (after make_state) and after it.
  virtual Status begin_mtp(const ForwardBatch& batch, State& state) {
    (void)batch, (void)state;
    return Status::ok();
  }
  virtual void end_mtp(const State& state) { (void)state; }
  // forward_mtp_device before its layer: the rows' state over T rows in persistent device buffers (a
  // continuation reads the staged chain state, an extend writes what continuations will reuse).
  virtual Status begin_mtp_device(int64_t T, MtpDeviceRows rows, State& state) {
    (void)T, (void)rows, (void)state;
    return Status::ok();
  }

  Layer load_layer(WeightLoader& wl, int64_t l, bool moe) {
    const std::string p = decoder_layer_prefix(l);
    Layer d;
    d.input_norm = wl.get(decl::replicated(p + "input_layernorm.weight", {cfg_.d_model}));
    d.post_norm = wl.get(decl::replicated(p + "post_attention_layernorm.weight", {cfg_.d_model}));
    d.attn = load_attention(wl, p + "self_attn.", l);
    d.mlp = load_mlp(wl, p + "mlp.", moe);
    return d;
  }

  // x += attn(rmsnorm(x)); x += mlp(rmsnorm(x)). Fused chaining (h_io, next_norm given): *h_io holds
  // rmsnorm(x, layer.input_norm) on entry and rmsnorm(x, *next_norm) on return (the next layer's input norm
  // or the final norm), the MLP's all-reduce + add + that norm fused where the output is a tp partial sum.
  Status run_layer(const Layer& layer, Tensor& x, const Tensor& positions, const backend::AttentionMeta& meta,
                   kvcache::KvCache& kv, int64_t cache_layer, State& state, Tensor* h_io = nullptr,
                   const Tensor* next_norm = nullptr) {
    const int64_t T = x.dim(0);
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    Tensor h = h_io != nullptr ? *h_io : be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    Tensor o = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    if (h_io == nullptr) be_.rmsnorm(x, layer.input_norm, eps, h);
    // Host-tier blocks loaded per layer, overlapped with the layers before (kvcache/layer_load_gate.h).
    if (kvcache::LayerLoadGate* gate = kv.load_gate()) MX_RETURN_IF_ERROR(gate->wait(cache_layer));
    MX_RETURN_IF_ERROR(attend(layer.attn, h, positions, meta, kv, cache_layer, state, o));
    // TP: o_proj over this rank's heads, summed, added to x and normed (one fused kernel where given)
    MX_RETURN_IF_ERROR(tp_.reduce_add_norm(o, x, layer.post_norm, static_cast<float>(cfg_.rms_norm_eps), h));
    if (next_norm != nullptr && h_io != nullptr) {
      const bool fuse = tp_.fused() && !dp_moe_.exchanges(layer.mlp);
      MX_RETURN_IF_ERROR(dp_moe_.mlp(be_, cfg_, layer.mlp, tp_, h, o, /*reduce=*/!fuse));  // TP / DP attention
      if (fuse) return tp_.reduce_add_norm(o, x, *next_norm, eps, *h_io);  // TP: fused
      be_.add_rmsnorm(o, x, *next_norm, eps, *h_io);  // one kernel where the backend fuses it
      return Status::ok();
    }
    MX_RETURN_IF_ERROR(dp_moe_.mlp(be_, cfg_, layer.mlp, tp_, h, o));  // TP / DP attention
    be_.add(x, o);
    return Status::ok();
  }

  // The MoE blocks an idle DP group joins: the MTP layer's, or the target's in layer order.
  std::vector<const MoeBlock*> moe_blocks(bool mtp) const {
    std::vector<const MoeBlock*> blocks;
    if (mtp) {
      blocks.push_back(&std::get<MoeBlock>(mtp_->block.mlp));
    } else {
      for (const Layer& layer : layers_)
        if (const auto* moe = std::get_if<MoeBlock>(&layer.mlp)) blocks.push_back(moe);
    }
    return blocks;
  }

  std::vector<Layer> layers_;
  std::optional<MtpLayer> mtp_;
};

}  // namespace mxserve::model
