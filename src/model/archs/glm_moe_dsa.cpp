// glm_moe_dsa, as transformers 5.17 computes it (research/glm5-dsa.md):
//   x = embed[ids]; per layer l: x += MLA_DSA_l(rmsnorm(x)); x += (dense MLP | MoE)(rmsnorm(x));
//   logits = lm_head(rmsnorm(x)). A "full" layer runs its indexer; a "shared" layer reuses the top-k of
//   the most recent full layer of the same forward. MTP layer L = n_layers (own full indexer, sparse MoE):
//   y = shared_head.norm(Layer_L(eh_proj(cat(enorm(embed(x_{t+1})), hnorm(h_t))))), logits = lm_head(y).
//   index_share_for_mtp_iteration: draft-chain steps >= 2 (ForwardBatch::mtp_first_step_rows) attend over the
//   top-k the chain's first step (the MTP extend) computed instead of running the MTP indexer's scores again
//   (its keys are still written); the target's verification keeps the outputs exact.
// KV layout per cached layer: kLatent [kv_lora_rank + qk_rope_head_dim]; full layers (and the MTP layer)
// add kIndexerKey [index_head_dim]. Shared layers cache no indexer keys.
// Tensor parallel (docs/parallel.md): each rank runs its attention heads (q_b / kv_b rows, o_proj columns),
// its slice of every MLP / expert width and its vocabulary rows; the latent cache, the indexer and its
// top-k are replicated. "TP:" marks the collectives -- all-reduces after the embedding, after o_proj and
// after the MLP / MoE, the logits all-gather, and (full indexer layers) the checks that the indexer's input
// and its top-k are the same on every rank.
// DP attention ("DP:", docs/parallel.md): attention runs whole per DP rank on its own latent cache; each MoE
// block exchanges tokens over the world (model/layers/dp_moe.h), an idle DP rank joining with 0 rows.
#include "model/archs/glm_moe_dsa.h"

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <variant>

#include "core/check.h"
#include "model/archs/glm_moe_dsa_config.h"
#include "model/layers/blocks.h"
#include "model/layers/dp_moe.h"
#include "model/layers/mla_attention.h"
#include "model/layers/tensor_parallel.h"
#include "model/layers/weight_decl.h"

namespace mxserve::model {
namespace {

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

struct DecoderLayer {
  Tensor input_norm, post_norm;  // [H]
  MlaAttention attn;
  std::variant<SwigluMlp, MoeBlock> mlp;
};

DecoderLayer load_layer(WeightLoader& wl, const ModelConfig& c, int64_t l, bool moe, bool full_indexer) {
  const std::string p = layer_prefix(l);
  DecoderLayer d;
  d.input_norm = wl.get(decl::replicated(p + "input_layernorm.weight", {c.d_model}));
  d.post_norm = wl.get(decl::replicated(p + "post_attention_layernorm.weight", {c.d_model}));
  d.attn = MlaAttention::load(wl, p + "self_attn.", c, full_indexer);
  if (moe) d.mlp = MoeBlock::load(wl, p + "mlp.", c);
  else d.mlp = SwigluMlp::load(wl, p + "mlp.", c.d_model, c.dense_inter);
  return d;
}

struct MtpLayer {
  Tensor enorm, hnorm, shared_head_norm;  // [H]
  Tensor eh_proj_e, eh_proj_h;            // eh_proj [H, 2H] split into its embedding / hidden halves
  DecoderLayer block;
};

class GlmMoeDsaModel final : public CausalLM {
 public:
  // comm: the tensor-parallel group (nullptr: one rank). attn_cfg_ is cfg with this rank's head count.
  GlmMoeDsaModel(const ModelConfig& cfg, backend::Backend& be, backend::MlaDsaOps& ops,
                 const parallel::RankLayout& rank, parallel::Communicator* comm, DpMoeExchange dp_moe)
      : cfg_(cfg), attn_cfg_(cfg), dsa_(glm_moe_dsa_config(cfg)), be_(be), ops_(ops), tp_(be, rank, comm),
        dp_moe_(dp_moe) {
    attn_cfg_.n_heads = cfg.n_heads / rank.tp;  // the launch checked tp divides them
    attn_cfg_.n_kv_heads = attn_cfg_.n_heads;   // MLA: one "KV head" per query head (decompressed)
  }

  Status load(WeightLoader& wl, bool include_mtp) {
    const int64_t H = cfg_.d_model;
    tp_.load_vocab(wl, cfg_);  // TP: embed_tokens / lm_head, this rank's vocabulary rows
    final_norm_ = wl.get(decl::replicated("model.norm.weight", {H}));
    for (int64_t l = 0; l < cfg_.n_layers; ++l)
      layers_.push_back(load_layer(wl, cfg_, l, cfg_.is_moe_layer(l), dsa_.full_indexer[l]));
    const std::string p = layer_prefix(cfg_.n_layers);
    if (include_mtp) {
      wl.ignore(p + "shared_head.head.weight");  // optional copies: the target's head / embedding are used
      wl.ignore(p + "embed_tokens.weight");
      MtpLayer m;
      m.enorm = wl.get(decl::replicated(p + "enorm.weight", {H}));
      m.hnorm = wl.get(decl::replicated(p + "hnorm.weight", {H}));
      m.shared_head_norm = wl.get(decl::replicated(p + "shared_head.norm.weight", {H}));
      const WeightSpec eh_proj = decl::linear(p + "eh_proj.weight", H, 2 * H, parallel::ShardAxis::kNone);
      m.eh_proj_e = wl.columns(eh_proj, 0, H);
      m.eh_proj_h = wl.columns(eh_proj, H, 2 * H);
      m.block = load_layer(wl, cfg_, cfg_.n_layers, /*moe=*/true, /*full_indexer=*/true);
      mtp_ = std::move(m);
    } else {
      for (int64_t i = 0; i < cfg_.n_mtp_layers; ++i) wl.ignore_prefix(layer_prefix(cfg_.n_layers + i));
    }
    return Status::ok();
  }

  const ModelConfig& config() const override { return cfg_; }
  bool has_mtp() const override { return mtp_.has_value(); }

  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    kvcache::KvCacheSpec s;
    s.n_blocks = n_blocks;
    s.block_size = block_size;
    const DType dt = be_.activation_dtype();
    for (int64_t l = 0; l < cfg_.n_layers + (mtp_ ? 1 : 0); ++l) {
      kvcache::CacheLayerSpec layer;
      layer.tensors.push_back({kvcache::CacheRole::kLatent, dsa_.cache_width(), dt});
      if (l >= cfg_.n_layers || dsa_.full_indexer[l])
        layer.tensors.push_back({kvcache::CacheRole::kIndexerKey, dsa_.index_head_dim, dt});
      s.layers.push_back(std::move(layer));
    }
    return s;
  }

  Result<ForwardOutput> forward(const ForwardBatch& batch, kvcache::KvCache& kv) override {
    if (batch.n_tokens() == 0 && dp_moe_.enabled()) return idle_forward(/*mtp=*/false);
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    const int64_t T = batch.n_tokens();
    MX_ASSIGN_OR_RETURN(Uploaded up, upload_batch(batch, kv));
    auto& [ids, positions, meta] = up;
    Tensor x = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    MX_RETURN_IF_ERROR(tp_.embed(ids, x));  // TP: each token's row came from one rank, zeros from the others
    Tensor topk = be_.alloc(DType::kI32, {T, dsa_.index_topk});  // written by full layers, read by shared ones
    for (int64_t l = 0; l < cfg_.n_layers; ++l)
      MX_RETURN_IF_ERROR(run_layer(layers_[l], x, positions, meta, kv, l, topk));
    be_.rmsnorm(x, final_norm_, static_cast<float>(cfg_.rms_norm_eps), x);
    return tp_.head(batch, x);  // TP: vocabulary-parallel head, logits all-gathered
  }

  // No decode graphs yet: the engine logs this once and runs every step eagerly.
  Status forward_device(const Tensor&, const Tensor&, const backend::AttentionMeta&, kvcache::KvCache&,
                        Tensor&) override {
    return unsupported("glm_moe_dsa has no device-input forward yet (its MLA / DSA decode is not captured in CUDA "
                       "graphs); decode runs eagerly -- pass --disable-cuda-graph to silence this");
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
    be_.linear(e, mtp_->eh_proj_e, nullptr, x);  // eh_proj(cat(e, h)) = e @ We^T + h @ Wh^T
    be_.linear(h, mtp_->eh_proj_h, nullptr, xh);
    be_.add(x, xh);
    Tensor topk = be_.alloc(DType::kI32, {T, dsa_.index_topk});
    MX_ASSIGN_OR_RETURN(const bool reuse, shared_mtp_topk(batch, topk));
    MX_RETURN_IF_ERROR(run_layer(mtp_->block, x, positions, meta, kv, cfg_.n_layers, topk, reuse));
    if (!reuse) first_step_topk_ = topk;
    be_.rmsnorm(x, mtp_->shared_head_norm, eps, x);
    return tp_.head(batch, x);
  }

  // bench-model hook: the attention part (norm, MLA with its indexer on a full layer) or the MLP part of one
  // layer, as run_layer does them. On a shared-indexer layer the top-k is the closure's own (not recomputed).
  Result<std::function<void(Tensor&)>> bind_layer_part(int64_t layer, LayerPart part, const ForwardBatch& batch,
                                                       kvcache::KvCache& kv) override {
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    if (dp_moe_.enabled()) return unsupported("bind_layer_part with DP attention (its MoE blocks exchange tokens)");
    if (layer < 0 || layer >= cfg_.n_layers)
      return invalid_argument("bind_layer_part: layer " + std::to_string(layer) + " of " + std::to_string(cfg_.n_layers));
    MX_ASSIGN_OR_RETURN(Uploaded uploaded, upload_batch(batch, kv));
    auto up = std::make_shared<Uploaded>(std::move(uploaded));
    auto topk = std::make_shared<Tensor>(be_.alloc(DType::kI32, {batch.n_tokens(), dsa_.index_topk}));
    const DecoderLayer* L = &layers_[layer];
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    return std::function<void(Tensor&)>([this, up, topk, L, eps, layer, part, &kv](Tensor& x) {
      Tensor h = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
      Tensor o = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
      if (part == LayerPart::kAttention) {
        be_.rmsnorm(x, L->input_norm, eps, h);
        Tensor* index_keys = L->attn.indexer ? &kv.tensor(layer, kvcache::CacheRole::kIndexerKey) : nullptr;
        L->attn.forward(be_, ops_, attn_cfg_, h, up->positions, up->meta, kv.tensor(layer, kvcache::CacheRole::kLatent),
                        index_keys, *topk, o);
        MX_CHECK_MSG(tp_.reduce_partial(o).is_ok(), "bind_layer_part: all-reduce failed");
      } else {
        be_.rmsnorm(x, L->post_norm, eps, h);
        MX_CHECK_MSG(dp_moe_.mlp(be_, cfg_, L->mlp, tp_, h, o).is_ok(), "bind_layer_part: MLP failed");
      }
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

  Result<Uploaded> upload_batch(const ForwardBatch& batch, kvcache::KvCache& kv) {
    const int64_t T = batch.n_tokens();
    Uploaded u;
    u.ids = tp_.upload_ids(batch);  // TP: rows of this rank's vocabulary slice; other ranks' ids -> the zero row
    u.positions = be_.upload(Tensor::view_of(const_cast<int32_t*>(batch.positions.data()), DType::kI32, {T}));
    kernels::AttentionParams ap;  // paging + tree rows; the MLA / indexer shapes travel in their own params
    ap.n_heads = static_cast<int32_t>(attn_cfg_.n_heads);  // this rank's heads
    ap.n_kv_heads = 1;
    ap.head_dim = static_cast<int32_t>(dsa_.cache_width());
    ap.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dsa_.qk_head_dim())));
    MX_ASSIGN_OR_RETURN(u.meta, build_attention_meta(batch, be_, kv.spec().block_size, ap, kv.block_tables()));
    return u;
  }

  // index_share_for_mtp_iteration: a draft-chain continuation (batch.mtp_first_step_rows) takes the top-k rows
  // the chain's first MTP step computed (first_step_topk_) into topk and returns true; false: the MTP layer's
  // indexer runs. Rows outside the stored first step are an error naming them.
  Result<bool> shared_mtp_topk(const ForwardBatch& batch, Tensor& topk) {
    if (batch.mtp_first_step_rows.empty() || !dsa_.index_share_for_mtp_iteration) return false;
    const int64_t T = batch.n_tokens();
    const int64_t have = first_step_topk_.defined() ? first_step_topk_.dim(0) : 0;
    if (static_cast<int64_t>(batch.mtp_first_step_rows.size()) != T)
      return invalid_argument("forward_mtp: mtp_first_step_rows has " +
                              std::to_string(batch.mtp_first_step_rows.size()) + " rows for " + std::to_string(T) +
                              " tokens");
    for (int32_t r : batch.mtp_first_step_rows)
      if (r < 0 || r >= have)
        return invalid_argument("forward_mtp: mtp_first_step_rows names row " + std::to_string(r) +
                                " of a first draft step with " + std::to_string(have) + " rows");
    Tensor dev_rows =
        be_.upload(Tensor::view_of(const_cast<int32_t*>(batch.mtp_first_step_rows.data()), DType::kI32, {T}));
    be_.gather_rows(first_step_topk_, dev_rows, topk);
    return true;
  }

  Status run_layer(const DecoderLayer& layer, Tensor& x, const Tensor& positions, const backend::AttentionMeta& meta,
                   kvcache::KvCache& kv, int64_t cache_layer, Tensor& topk, bool reuse_topk = false) {
    const int64_t T = x.dim(0);
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const DType act = be_.activation_dtype();
    Tensor h = be_.alloc(act, {T, cfg_.d_model});
    Tensor o = be_.alloc(act, {T, cfg_.d_model});
    be_.rmsnorm(x, layer.input_norm, eps, h);
    if (layer.attn.indexer && !reuse_topk)  // TP: the indexer's input (and through replicated q_a, its query latent)
      MX_RETURN_IF_ERROR(tp_.check_replicated(h, "the DSA indexer input of layer " + std::to_string(cache_layer)));
    Tensor* index_keys =
        layer.attn.indexer ? &kv.tensor(cache_layer, kvcache::CacheRole::kIndexerKey) : nullptr;
    layer.attn.forward(be_, ops_, attn_cfg_, h, positions, meta, kv.tensor(cache_layer, kvcache::CacheRole::kLatent),
                       index_keys, topk, o, reuse_topk);
    if (layer.attn.indexer && !reuse_topk)  // TP: the replicated indexer must pick the same keys on every rank
      MX_RETURN_IF_ERROR(tp_.check_replicated(topk, "the DSA top-k of layer " + std::to_string(cache_layer)));
    MX_RETURN_IF_ERROR(tp_.reduce_partial(o));  // TP: o_proj over this rank's heads
    be_.add(x, o);
    be_.rmsnorm(x, layer.post_norm, eps, h);
    MX_RETURN_IF_ERROR(dp_moe_.mlp(be_, cfg_, layer.mlp, tp_, h, o));  // TP / DP attention
    be_.add(x, o);
    return Status::ok();
  }

  // DP attention, no tokens for this DP rank this step: join every MoE block's exchange with 0 rows.
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
  ModelConfig attn_cfg_;  // cfg_ with this rank's n_heads (tensor parallel)
  GlmMoeDsaConfig dsa_;
  backend::Backend& be_;
  backend::MlaDsaOps& ops_;  // the same backend's MLA / DSA ops
  TensorParallel tp_;        // the vocabulary-parallel embedding / head, the group's collectives
  DpMoeExchange dp_moe_;     // DP attention's MoE exchange (disabled otherwise)
  Tensor final_norm_;        // [H]
  std::vector<DecoderLayer> layers_;
  std::optional<MtpLayer> mtp_;
  // i32 [T, index_topk]: the MTP layer's top-k of the latest forward_mtp that ran its indexer (a draft chain's
  // first step), reused by the chain's later steps under index_share_for_mtp_iteration.
  Tensor first_step_topk_;
};

Result<std::unique_ptr<CausalLM>> build_glm_moe_dsa(const ModelConfig& cfg, WeightLoader& wl, backend::Backend& be,
                                                    bool include_mtp) {
  backend::MlaDsaOps* ops = backend::mla_dsa_ops(be);
  if (ops == nullptr)
    return unsupported(cfg.source + ": glm_moe_dsa (MLA + DSA attention) is not implemented on the " + be.name() +
                       " backend yet; use --backend cpu or cuda");
  const GlmMoeDsaConfig& d = glm_moe_dsa_config(cfg);
  if (static_cast<int64_t>(d.full_indexer.size()) < cfg.n_layers)
    return invalid_argument(cfg.source + ": indexer_types covers " + std::to_string(d.full_indexer.size()) +
                            " of " + std::to_string(cfg.n_layers) + " layers");
  const int tp = wl.rank().tp;
  if (tp > 1 && cfg.n_heads % tp != 0)  // heads are the unit MLA splits over ranks
    return invalid_argument(cfg.source + ": num_attention_heads " + std::to_string(cfg.n_heads) +
                            " is not divisible by --tensor-parallel-size " + std::to_string(tp));
  DpMoeExchange dp_moe;
  if (wl.rank().dp_attention) dp_moe.world = wl.moe_communicator();
  if (wl.rank().dp_attention && wl.rank().tp > 1) dp_moe.tp = wl.communicator();
  auto model = std::make_unique<GlmMoeDsaModel>(cfg, be, *ops, wl.rank(), wl.communicator(), dp_moe);
  MX_RETURN_IF_ERROR(model->load(wl, include_mtp));
  return std::unique_ptr<CausalLM>(std::move(model));
}

}  // namespace

const ArchitectureDef& glm_moe_dsa_architecture() {
  static const ArchitectureDef d = [] {
    ArchitectureDef a;
    a.hf_name = "GlmMoeDsaForCausalLM";
    a.model_type = "glm_moe_dsa";
    a.default_partial_rotary_factor = 1.0;  // unused: MLA ropes qk_rope_head_dim dims (parse_config)
    a.parse_config = &parse_glm_moe_dsa_config;
    a.build = &build_glm_moe_dsa;
    return a;
  }();
  return d;
}

std::vector<WeightSpec> glm_moe_dsa_weight_table(const ModelConfig& c, bool include_mtp) {
  return record_weights(glm_moe_dsa_architecture(), c, include_mtp).table;
}

}  // namespace mxserve::model
