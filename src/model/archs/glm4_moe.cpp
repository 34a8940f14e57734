// glm4_moe, exactly as transformers 5.17 computes it (research/models-formats.md section 1):
//   x = embed[ids]; per layer: x += attn(rmsnorm(x)); x += (dense MLP | MoE)(rmsnorm(x));
//   logits = lm_head(rmsnorm(x)).  MTP layer L = n_layers:
//   y = shared_head.norm(Layer_L(eh_proj(cat(enorm(embed(x_{t+1})), hnorm(h_t))))), logits = lm_head(y).
// Tensor parallel (docs/parallel.md; the loader hands this rank its slices): each rank runs its heads, its
// slice of every MLP / expert width and its vocabulary rows; "TP:" marks the collectives -- all-reduces after
// the embedding lookup, after o_proj and after the MLP / MoE (shared + routed partial sums together), and an
// all-gather of the logits (the vocabulary-parallel pieces: model/layers/tensor_parallel.h). Expert parallel (ep = tp): each rank holds E / ep whole experts and the MoE block's
// output is a partial sum over them (MoeBlock, blocks.h), summed by that same all-reduce: no extra collective.
// The communicator is this rank's tp group's. DP attention ("DP:"): each MoE block
// exchanges tokens over the whole world instead (model/layers/dp_moe.h); a DP group without tokens this step
// still joins every MoE block's exchange (idle_forward).
#include "model/archs/glm4_moe.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <variant>

#include "core/check.h"
#include "core/logging.h"
#include "model/layers/blocks.h"
#include "model/layers/dp_moe.h"
#include "model/layers/tensor_parallel.h"
#include "model/layers/weight_decl.h"

namespace mxserve::model {
namespace {

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

struct DecoderLayer {
  Tensor input_norm, post_norm;  // [H]
  GqaAttention attn;
  std::variant<SwigluMlp, MoeBlock> mlp;
};

DecoderLayer load_layer(WeightLoader& wl, const ModelConfig& c, int64_t l, bool moe) {
  const std::string p = layer_prefix(l);
  DecoderLayer d;
  d.input_norm = wl.get(decl::replicated(p + "input_layernorm.weight", {c.d_model}));
  d.post_norm = wl.get(decl::replicated(p + "post_attention_layernorm.weight", {c.d_model}));
  d.attn = GqaAttention::load(wl, p + "self_attn.", c);
  if (moe) d.mlp = MoeBlock::load(wl, p + "mlp.", c);
  else d.mlp = SwigluMlp::load(wl, p + "mlp.", c.d_model, c.dense_inter);
  return d;
}

struct MtpLayer {
  Tensor enorm, hnorm, shared_head_norm;  // [H]
  Tensor eh_proj_e, eh_proj_h;            // eh_proj [H, 2H] split into its embedding / hidden halves
  DecoderLayer block;
};

class Glm4MoeModel final : public CausalLM {
 public:
  // comm: the tensor-parallel group (nullptr: one rank; a one-rank world's communicator given anyway runs
  // every collective as the identity: the launch's NCCL one-rank test switch). attn_cfg_ is cfg with this
  // rank's head counts.
  Glm4MoeModel(const ModelConfig& cfg, backend::Backend& be, const parallel::RankLayout& rank,
               parallel::Communicator* comm, parallel::Communicator* moe_comm)
      : cfg_(cfg), attn_cfg_(cfg), be_(be), tp_(be, rank, comm),
        dp_moe_{rank.dp_attention ? moe_comm : nullptr, rank.tp > 1 ? comm : nullptr} {
    attn_cfg_.n_heads = cfg.n_heads / rank.tp;  // the launch checked tp divides them
    attn_cfg_.n_kv_heads = std::max<int64_t>(1, cfg.n_kv_heads / rank.tp);  // replicated when tp > n_kv_heads
  }

  // Binds (or, on a recording loader, declares) every weight; names the checkpoint tensors left unused.
  Status load(WeightLoader& wl, bool include_mtp) {
    const int64_t H = cfg_.d_model;
    tp_.load_vocab(wl, cfg_);  // TP: embed_tokens / lm_head, this rank's vocabulary rows
    final_norm_ = wl.get(decl::replicated("model.norm.weight", {H}));
    for (int64_t l = 0; l < cfg_.n_layers; ++l) layers_.push_back(load_layer(wl, cfg_, l, cfg_.is_moe_layer(l)));
    const std::string p = layer_prefix(cfg_.n_layers);
    if (include_mtp) {
      // The MTP layer's optional copies of the head and embedding: the target's are used instead.
      wl.ignore(p + "shared_head.head.weight");
      wl.ignore(p + "embed_tokens.weight");
      MtpLayer m;
      m.enorm = wl.get(decl::replicated(p + "enorm.weight", {H}));
      m.hnorm = wl.get(decl::replicated(p + "hnorm.weight", {H}));
      m.shared_head_norm = wl.get(decl::replicated(p + "shared_head.norm.weight", {H}));
      const WeightSpec eh_proj = decl::linear(p + "eh_proj.weight", H, 2 * H, parallel::ShardAxis::kNone);
      m.eh_proj_e = wl.columns(eh_proj, 0, H);
      m.eh_proj_h = wl.columns(eh_proj, H, 2 * H);
      m.block = load_layer(wl, cfg_, cfg_.n_layers, /*moe=*/true);
      mtp_ = std::move(m);
    } else {
      // MTP layers the config declares but the caller chose not to load.
      for (int64_t i = 0; i < cfg_.n_mtp_layers; ++i) wl.ignore_prefix(layer_prefix(cfg_.n_layers + i));
    }
    return Status::ok();
  }

  const ModelConfig& config() const override { return cfg_; }
  bool has_mtp() const override { return mtp_.has_value(); }

  // GQA: K and V of n_kv_heads x head_dim per layer (the MTP layer has its own), in the activation dtype,
  // or FP8 E4M3 codes with per-(slot, kv head) scales (--kv-cache-dtype fp8_e4m3).
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    const int64_t n_cached = cfg_.n_layers + (mtp_ ? 1 : 0);
    if (kv_dtype_ == kvcache::KvCacheDtype::kFp8E4M3)
      return kvcache::KvCacheSpec::gqa_fp8(n_cached, n_blocks, block_size, attn_cfg_.n_kv_heads, cfg_.head_dim);
    return kvcache::KvCacheSpec::gqa(n_cached, n_blocks, block_size, attn_cfg_.n_kv_heads, cfg_.head_dim,
                                     be_.activation_dtype());
  }
  Status set_kv_cache_dtype(kvcache::KvCacheDtype dtype) override {
    kv_dtype_ = dtype;
    return Status::ok();
  }
  kvcache::KvCacheDtype kv_cache_dtype() const override { return kv_dtype_; }

  Result<ForwardOutput> forward(const ForwardBatch& batch, kvcache::KvCache& kv) override {
    if (batch.n_tokens() == 0 && dp_moe_.enabled()) return idle_forward(/*mtp=*/false);
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    const int64_t T = batch.n_tokens();
    MX_ASSIGN_OR_RETURN(Uploaded up, upload_batch(batch, kv));
    auto& [ids, positions, meta] = up;
    Tensor x = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    MX_RETURN_IF_ERROR(tp_.embed(ids, x));  // TP: each token's row came from one rank, zeros from the others
    for (int64_t l = 0; l < cfg_.n_layers; ++l) MX_RETURN_IF_ERROR(run_layer(layers_[l], x, positions, meta, kv, l));
    be_.rmsnorm(x, final_norm_, static_cast<float>(cfg_.rms_norm_eps), x);
    return tp_.head(batch, x);  // TP: vocabulary-parallel head, logits all-gathered
  }

  Status forward_device(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& device_meta,
                        kvcache::KvCache& kv, Tensor& logits) override {
    if (tp_.splits() || dp_moe_.enabled())
      return unsupported("forward_device (CUDA graph capture) with tensor parallelism or DP attention");
    const int64_t T = ids.numel();
    if (positions.numel() != T || device_meta.params.n_tokens != T || logits.ndim() != 2 || logits.dim(0) != T ||
        logits.dim(1) != cfg_.vocab_size)
      return invalid_argument("forward_device: " + std::to_string(T) + " ids, " + std::to_string(positions.numel()) +
                              " positions, attention metadata for " + std::to_string(device_meta.params.n_tokens) +
                              " rows, logits " + logits.describe());
    backend::AttentionMeta meta = device_meta;
    attention_shape(meta.params);
    Tensor x = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    MX_RETURN_IF_ERROR(tp_.embed(ids, x));
    for (int64_t l = 0; l < cfg_.n_layers; ++l) MX_RETURN_IF_ERROR(run_layer(layers_[l], x, positions, meta, kv, l));
    be_.rmsnorm(x, final_norm_, static_cast<float>(cfg_.rms_norm_eps), x);
    be_.linear(x, tp_.lm_head(), nullptr, logits);
    return Status::ok();
  }

  Result<ForwardOutput> forward_mtp(const ForwardBatch& batch, const Tensor& hidden_in,
                                    kvcache::KvCache& kv) override {
    if (!mtp_) return unsupported("this model was loaded without an MTP layer");
    if (batch.n_tokens() == 0 && dp_moe_.enabled()) return idle_forward(/*mtp=*/true);
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    const int64_t T = batch.n_tokens();
    if (hidden_in.ndim() != 2 || hidden_in.dim(0) != T || hidden_in.dim(1) != cfg_.d_model)
      return invalid_argument("forward_mtp: hidden_in is " + hidden_in.describe() + ", expected [" +
                              std::to_string(T) + ", " + std::to_string(cfg_.d_model) + "]");
    MX_ASSIGN_OR_RETURN(Uploaded up, upload_batch(batch, kv));
    auto& [ids, positions, meta] = up;
    const DType act = be_.activation_dtype();
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    Tensor e = be_.alloc(act, {T, cfg_.d_model});
    MX_RETURN_IF_ERROR(tp_.embed(ids, e));  // TP: vocabulary-parallel embedding
    be_.rmsnorm(e, mtp_->enorm, eps, e);
    Tensor h = be_.alloc(act, {T, cfg_.d_model});
    be_.rmsnorm(hidden_in, mtp_->hnorm, eps, h);
    Tensor x = be_.alloc(act, {T, cfg_.d_model});
    Tensor xh = be_.alloc(act, {T, cfg_.d_model});
    be_.linear(e, mtp_->eh_proj_e, nullptr, x);   // eh_proj(cat(e, h)) = e @ We^T + h @ Wh^T
    be_.linear(h, mtp_->eh_proj_h, nullptr, xh);
    be_.add(x, xh);
    MX_RETURN_IF_ERROR(run_layer(mtp_->block, x, positions, meta, kv, cfg_.n_layers));
    be_.rmsnorm(x, mtp_->shared_head_norm, eps, x);
    return tp_.head(batch, x);  // TP: vocabulary-parallel head, logits all-gathered
  }

  Result<std::function<void(Tensor&)>> bind_layer_part(int64_t layer, LayerPart part, const ForwardBatch& batch,
                                                       kvcache::KvCache& kv) override {
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    if (dp_moe_.enabled()) return unsupported("bind_layer_part with DP attention (its MoE blocks exchange tokens)");
    if (layer < 0 || layer >= cfg_.n_layers)
      return invalid_argument("bind_layer_part: layer " + std::to_string(layer) + " of " +
                              std::to_string(cfg_.n_layers));
    MX_ASSIGN_OR_RETURN(Uploaded uploaded, upload_batch(batch, kv));
    auto up = std::make_shared<Uploaded>(std::move(uploaded));
    const DecoderLayer* L = &layers_[layer];
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    if (part == LayerPart::kAttention) {
      return std::function<void(Tensor&)>([this, up, L, eps, layer, &kv](Tensor& x) {
        Tensor h = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
        Tensor o = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
        be_.rmsnorm(x, L->input_norm, eps, h);
        L->attn.forward(be_, attn_cfg_, h, up->positions, up->meta, kv.k(layer), kv.v(layer),
                        kv.scales_if_any(layer, kvcache::CacheRole::kKey),
                        kv.scales_if_any(layer, kvcache::CacheRole::kValue), o);
        MX_CHECK_MSG(tp_.reduce_partial(o).is_ok(), "bind_layer_part: all-reduce failed");
        be_.add(x, o);
      });
    }
    return std::function<void(Tensor&)>([this, L, eps](Tensor& x) {
      Tensor h = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
      Tensor o = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
      be_.rmsnorm(x, L->post_norm, eps, h);
      if (const auto* moe = std::get_if<MoeBlock>(&L->mlp)) moe->forward(be_, cfg_, h, o);
      else std::get<SwigluMlp>(L->mlp).forward(be_, h, o);
      MX_CHECK_MSG(tp_.reduce_partial(o).is_ok(), "bind_layer_part: all-reduce failed");
      be_.add(x, o);
    });
  }

 private:
  struct Uploaded {
    Tensor ids, positions;
    backend::AttentionMeta meta;
  };

  Status check_batch(const ForwardBatch& batch, kvcache::KvCache& kv) const {
    const auto& s = kv.spec();
    const kvcache::KvCacheSpec want = kv_spec(s.n_blocks, s.block_size);
    if (s.n_layers() < want.n_layers()) return invalid_argument("KV cache geometry does not match the model");
    for (int64_t l = 0; l < want.n_layers(); ++l)
      for (const auto& t : want.layers[l].tensors) {
        const kvcache::CacheTensorSpec* have = s.layers[l].find(t.role);
        if (have == nullptr || have->width != t.width || have->dtype != t.dtype)
          return invalid_argument("KV cache geometry does not match the model (layer " + std::to_string(l) + ", " +
                                  kvcache::cache_role_name(t.role) + ")");
      }
    return batch.validate(cfg_.vocab_size, s.n_blocks, s.block_size);
  }

  void attention_shape(kernels::AttentionParams& ap) const {
    ap.n_heads = static_cast<int32_t>(attn_cfg_.n_heads);  // this rank's heads (tensor parallel)
    ap.n_kv_heads = static_cast<int32_t>(attn_cfg_.n_kv_heads);
    ap.head_dim = static_cast<int32_t>(cfg_.head_dim);
    ap.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(cfg_.head_dim)));
  }

  Result<Uploaded> upload_batch(const ForwardBatch& batch, kvcache::KvCache& kv) {
    const int64_t T = batch.n_tokens();
    Uploaded u;
    u.ids = tp_.upload_ids(batch);  // TP: rows of this rank's vocabulary slice; other ranks' ids -> the zero row
    u.positions = be_.upload(Tensor::view_of(const_cast<int32_t*>(batch.positions.data()), DType::kI32, {T}));
    kernels::AttentionParams ap;
    attention_shape(ap);
    MX_ASSIGN_OR_RETURN(u.meta, build_attention_meta(batch, be_, kv.spec().block_size, ap, kv.block_tables()));
    return u;
  }

  Status run_layer(const DecoderLayer& layer, Tensor& x, const Tensor& positions, const backend::AttentionMeta& meta,
                   kvcache::KvCache& kv, int64_t cache_layer) {
    const int64_t T = x.dim(0);
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const DType act = be_.activation_dtype();
    Tensor h = be_.alloc(act, {T, cfg_.d_model});
    Tensor o = be_.alloc(act, {T, cfg_.d_model});
    be_.rmsnorm(x, layer.input_norm, eps, h);
    layer.attn.forward(be_, attn_cfg_, h, positions, meta, kv.k(cache_layer), kv.v(cache_layer),
                       kv.scales_if_any(cache_layer, kvcache::CacheRole::kKey),
                       kv.scales_if_any(cache_layer, kvcache::CacheRole::kValue), o);
    MX_RETURN_IF_ERROR(tp_.reduce_partial(o));  // TP
    be_.add(x, o);
    be_.rmsnorm(x, layer.post_norm, eps, h);
    MX_RETURN_IF_ERROR(dp_moe_.mlp(be_, cfg_, layer.mlp, tp_, h, o));  // TP / DP attention
    be_.add(x, o);
    return Status::ok();
  }

  // DP attention, no tokens for this DP group this step: join every MoE block's exchange with 0 rows.
  Result<ForwardOutput> idle_forward(bool mtp) {
    std::vector<const MoeBlock*> blocks;
    if (mtp) {
      blocks.push_back(&std::get<MoeBlock>(mtp_->block.mlp));
    } else {
      for (const DecoderLayer& layer : layers_)
        if (const auto* moe = std::get_if<MoeBlock>(&layer.mlp)) blocks.push_back(moe);
    }
    MX_RETURN_IF_ERROR(dp_moe_.idle(be_, cfg_, blocks));
    return ForwardOutput{};
  }

  ModelConfig cfg_;
  ModelConfig attn_cfg_;  // cfg_ with this rank's n_heads / n_kv_heads (tensor parallel)
  backend::Backend& be_;
  TensorParallel tp_;  // the vocabulary-parallel embedding / head and the group's all-reduce
  DpMoeExchange dp_moe_;  // DP attention's MoE exchange (disabled otherwise)
  Tensor final_norm_;  // [H]
  std::vector<DecoderLayer> layers_;
  std::optional<MtpLayer> mtp_;
  kvcache::KvCacheDtype kv_dtype_ = kvcache::KvCacheDtype::kAuto;
};

Result<std::unique_ptr<CausalLM>> build_glm4_moe(const ModelConfig& cfg, WeightLoader& wl, backend::Backend& be,
                                                 bool include_mtp) {
  auto model = std::make_unique<Glm4MoeModel>(cfg, be, wl.rank(), wl.communicator(),
                                              wl.moe_communicator());
  MX_RETURN_IF_ERROR(model->load(wl, include_mtp));
  return std::unique_ptr<CausalLM>(std::move(model));
}

}  // namespace

const ArchitectureDef& glm4_moe_architecture() {
  static const ArchitectureDef d = [] {
    ArchitectureDef a;
    a.hf_name = "Glm4MoeForCausalLM";
    a.model_type = "glm4_moe";
    a.default_partial_rotary_factor = 0.5;  // transformers' Glm4MoeConfig
    a.build = &build_glm4_moe;
    return a;
  }();
  return d;
}

std::vector<WeightSpec> glm4_moe_weight_table(const ModelConfig& c, bool include_mtp) {
  return record_weights(glm4_moe_architecture(), c, include_mtp).table;
}

BindOptions glm4_moe_bind_options(const ModelConfig& c, bool include_mtp) {
  return record_weights(glm4_moe_architecture(), c, include_mtp).bind;
}

}  // namespace mxserve::model
