// glm4_moe, exactly as transformers 5.17 computes it (research/models-formats.md section 1):
//   x = embed[ids]; per layer: x += attn(rmsnorm(x)); x += (dense MLP | MoE)(rmsnorm(x));
//   logits = lm_head(rmsnorm(x)).  MTP layer L = n_layers:
//   y = shared_head.norm(Layer_L(eh_proj(cat(enorm(embed(x_{t+1})), hnorm(h_t))))), logits = lm_head(y).
#include "model/archs/glm4_moe.h"

#include <functional>
#include <memory>
#include <variant>

#include "core/logging.h"
#include "model/layers/blocks.h"

namespace mxserve::model {
namespace {

const std::vector<Precision> kFloat = {Precision::kBF16, Precision::kF32, Precision::kF16};
// Linear weights may be stored quantized; they are dequantized on the host at load (weight_loader.h).
const std::vector<Precision> kAny = {Precision::kBF16,  Precision::kF32,      Precision::kF16,
                                     Precision::kMxfp4, Precision::kFp8Block, Precision::kFp8Tensor,
                                     Precision::kFp8Channel};
// Routed experts may also come from gpt-oss style fused *_blocks / *_scales tensors (quant/gpt_oss.h).
const std::vector<Precision> kExpert = {Precision::kBF16,      Precision::kF32,       Precision::kF16,
                                        Precision::kMxfp4,     Precision::kFp8Block,  Precision::kFp8Tensor,
                                        Precision::kFp8Channel, Precision::kMxfp4GptOss};
constexpr WeightRole kLinear = WeightRole::kLinear;

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

void add_decoder_layer(std::vector<WeightSpec>& t, const ModelConfig& c, int64_t l, bool moe) {
  const std::string p = layer_prefix(l);
  const int64_t H = c.d_model, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  t.push_back({p + "input_layernorm.weight", {H}, kFloat});
  t.push_back({p + "post_attention_layernorm.weight", {H}, kFloat});
  t.push_back({p + "self_attn.q_proj.weight", {q, H}, kAny, false, kLinear});
  t.push_back({p + "self_attn.k_proj.weight", {kv, H}, kAny, false, kLinear});
  t.push_back({p + "self_attn.v_proj.weight", {kv, H}, kAny, false, kLinear});
  t.push_back({p + "self_attn.o_proj.weight", {H, q}, kAny, false, kLinear});
  if (c.attention_bias) {
    t.push_back({p + "self_attn.q_proj.bias", {q}, kFloat});
    t.push_back({p + "self_attn.k_proj.bias", {kv}, kFloat});
    t.push_back({p + "self_attn.v_proj.bias", {kv}, kFloat});
  }
  if (c.use_qk_norm) {
    t.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, kFloat});
    t.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, kFloat});
  }
  if (!moe) {
    t.push_back({p + "mlp.gate_proj.weight", {c.dense_inter, H}, kAny, false, kLinear});
    t.push_back({p + "mlp.up_proj.weight", {c.dense_inter, H}, kAny, false, kLinear});
    t.push_back({p + "mlp.down_proj.weight", {H, c.dense_inter}, kAny, false, kLinear});
    return;
  }
  t.push_back({p + "mlp.gate.weight", {c.n_experts, H}, kAny, false, WeightRole::kRouter});
  t.push_back({p + "mlp.gate.e_score_correction_bias", {c.n_experts}, kFloat});
  for (int64_t e = 0; e < c.n_experts; ++e) {
    const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
    t.push_back({ep + "gate_proj.weight", {c.moe_inter, H}, kExpert, false, kLinear});
    t.push_back({ep + "up_proj.weight", {c.moe_inter, H}, kExpert, false, kLinear});
    t.push_back({ep + "down_proj.weight", {H, c.moe_inter}, kExpert, false, kLinear});
  }
  if (c.n_shared_experts > 0) {
    const std::string sp = p + "mlp.shared_experts.";
    t.push_back({sp + "gate_proj.weight", {c.shared_inter(), H}, kAny, false, kLinear});
    t.push_back({sp + "up_proj.weight", {c.shared_inter(), H}, kAny, false, kLinear});
    t.push_back({sp + "down_proj.weight", {H, c.shared_inter()}, kAny, false, kLinear});
  }
}

struct DecoderLayer {
  Tensor input_norm, post_norm;  // [H]
  GqaAttention attn;
  std::variant<SwigluMlp, MoeBlock> mlp;
};

DecoderLayer load_layer(WeightLoader& wl, const ModelConfig& c, int64_t l, bool moe) {
  const std::string p = layer_prefix(l);
  DecoderLayer d;
  d.input_norm = wl.get(p + "input_layernorm.weight");
  d.post_norm = wl.get(p + "post_attention_layernorm.weight");
  d.attn = GqaAttention::load(wl, p + "self_attn.", c);
  if (moe) d.mlp = MoeBlock::load(wl, p + "mlp.", c);
  else d.mlp = SwigluMlp::load(wl, p + "mlp.");
  return d;
}

struct MtpLayer {
  Tensor enorm, hnorm, shared_head_norm;  // [H]
  Tensor eh_proj_e, eh_proj_h;            // eh_proj [H, 2H] split into its embedding / hidden halves
  DecoderLayer block;
};

class Glm4MoeModel final : public CausalLM {
 public:
  Glm4MoeModel(const ModelConfig& cfg, backend::Backend& be) : cfg_(cfg), be_(be) {}

  Status load(WeightLoader& wl, bool include_mtp) {
    embed_ = wl.get("model.embed_tokens.weight");
    final_norm_ = wl.get("model.norm.weight");
    lm_head_ = cfg_.tie_word_embeddings ? embed_ : wl.get("lm_head.weight");
    for (int64_t l = 0; l < cfg_.n_layers; ++l) layers_.push_back(load_layer(wl, cfg_, l, cfg_.is_moe_layer(l)));
    if (include_mtp) {
      const std::string p = layer_prefix(cfg_.n_layers);
      MtpLayer m;
      m.enorm = wl.get(p + "enorm.weight");
      m.hnorm = wl.get(p + "hnorm.weight");
      m.shared_head_norm = wl.get(p + "shared_head.norm.weight");
      m.eh_proj_e = wl.columns(p + "eh_proj.weight", 0, cfg_.d_model);
      m.eh_proj_h = wl.columns(p + "eh_proj.weight", cfg_.d_model, 2 * cfg_.d_model);
      m.block = load_layer(wl, cfg_, cfg_.n_layers, /*moe=*/true);
      mtp_ = std::move(m);
    }
    return Status::ok();
  }

  const ModelConfig& config() const override { return cfg_; }
  bool has_mtp() const override { return mtp_.has_value(); }

  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    kvcache::KvCacheSpec s;
    s.n_layers = cfg_.n_layers + (mtp_ ? 1 : 0);
    s.n_blocks = n_blocks;
    s.block_size = block_size;
    s.n_kv_heads = cfg_.n_kv_heads;
    s.head_dim = cfg_.head_dim;
    s.dtype = be_.activation_dtype();
    return s;
  }

  Result<ForwardOutput> forward(const ForwardBatch& batch, kvcache::KvCache& kv) override {
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    const int64_t T = batch.n_tokens();
    auto [ids, positions, meta] = upload_batch(batch, kv);
    Tensor x = be_.alloc(be_.activation_dtype(), {T, cfg_.d_model});
    be_.embedding(embed_, ids, x);
    for (int64_t l = 0; l < cfg_.n_layers; ++l) run_layer(layers_[l], x, positions, meta, kv, l);
    be_.rmsnorm(x, final_norm_, static_cast<float>(cfg_.rms_norm_eps), x);
    return head(batch, x);
  }

  Result<ForwardOutput> forward_mtp(const ForwardBatch& batch, const Tensor& hidden_in,
                                    kvcache::KvCache& kv) override {
    if (!mtp_) return unsupported("this model was loaded without an MTP layer");
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    const int64_t T = batch.n_tokens();
    if (hidden_in.ndim() != 2 || hidden_in.dim(0) != T || hidden_in.dim(1) != cfg_.d_model)
      return invalid_argument("forward_mtp: hidden_in is " + hidden_in.describe() + ", expected [" +
                              std::to_string(T) + ", " + std::to_string(cfg_.d_model) + "]");
    auto [ids, positions, meta] = upload_batch(batch, kv);
    const DType act = be_.activation_dtype();
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    Tensor e = be_.alloc(act, {T, cfg_.d_model});
    be_.embedding(embed_, ids, e);
    be_.rmsnorm(e, mtp_->enorm, eps, e);
    Tensor h = be_.alloc(act, {T, cfg_.d_model});
    be_.rmsnorm(hidden_in, mtp_->hnorm, eps, h);
    Tensor x = be_.alloc(act, {T, cfg_.d_model});
    Tensor xh = be_.alloc(act, {T, cfg_.d_model});
    be_.linear(e, mtp_->eh_proj_e, nullptr, x);   // eh_proj(cat(e, h)) = e @ We^T + h @ Wh^T
    be_.linear(h, mtp_->eh_proj_h, nullptr, xh);
    be_.add(x, xh);
    run_layer(mtp_->block, x, positions, meta, kv, cfg_.n_layers);
    be_.rmsnorm(x, mtp_->shared_head_norm, eps, x);
    return head(batch, x);
  }

  Result<std::function<void(Tensor&)>> bind_layer_part(int64_t layer, LayerPart part, const ForwardBatch& batch,
                                                       kvcache::KvCache& kv) override {
    MX_RETURN_IF_ERROR(check_batch(batch, kv));
    if (layer < 0 || layer >= cfg_.n_layers)
      return invalid_argument("bind_layer_part: layer " + std::to_string(layer) + " of " +
                              std::to_string(cfg_.n_layers));
    auto up = std::make_shared<Uploaded>(upload_batch(batch, kv));
    const DecoderLayer* L = &layers_[layer];
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    if (part == LayerPart::kAttention) {
      return std::function<void(Tensor&)>([this, up, L, eps, layer, &kv](Tensor& x) {
        Tensor h = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
        Tensor o = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
        be_.rmsnorm(x, L->input_norm, eps, h);
        L->attn.forward(be_, cfg_, h, up->positions, up->meta, kv.k(layer), kv.v(layer), o);
        be_.add(x, o);
      });
    }
    return std::function<void(Tensor&)>([this, L, eps](Tensor& x) {
      Tensor h = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
      Tensor o = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
      be_.rmsnorm(x, L->post_norm, eps, h);
      if (const auto* moe = std::get_if<MoeBlock>(&L->mlp)) moe->forward(be_, cfg_, h, o);
      else std::get<SwigluMlp>(L->mlp).forward(be_, h, o);
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
    if (s.n_kv_heads != cfg_.n_kv_heads || s.head_dim != cfg_.head_dim ||
        s.n_layers < cfg_.n_layers + (mtp_ ? 1 : 0))
      return invalid_argument("KV cache geometry does not match the model");
    return batch.validate(cfg_.vocab_size, s.n_blocks, s.block_size);
  }

  Uploaded upload_batch(const ForwardBatch& batch, kvcache::KvCache& kv) {
    const int64_t T = batch.n_tokens();
    Uploaded u;
    u.ids = be_.upload(Tensor::view_of(const_cast<int32_t*>(batch.token_ids.data()), DType::kI32, {T}));
    u.positions = be_.upload(Tensor::view_of(const_cast<int32_t*>(batch.positions.data()), DType::kI32, {T}));
    kernels::AttentionParams ap;
    ap.n_heads = static_cast<int32_t>(cfg_.n_heads);
    ap.n_kv_heads = static_cast<int32_t>(cfg_.n_kv_heads);
    ap.head_dim = static_cast<int32_t>(cfg_.head_dim);
    ap.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(cfg_.head_dim)));
    u.meta = build_attention_meta(batch, be_, kv.spec().block_size, ap);
    return u;
  }

  void run_layer(const DecoderLayer& layer, Tensor& x, const Tensor& positions, const backend::AttentionMeta& meta,
                 kvcache::KvCache& kv, int64_t cache_layer) {
    const int64_t T = x.dim(0);
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const DType act = be_.activation_dtype();
    Tensor h = be_.alloc(act, {T, cfg_.d_model});
    Tensor o = be_.alloc(act, {T, cfg_.d_model});
    be_.rmsnorm(x, layer.input_norm, eps, h);
    layer.attn.forward(be_, cfg_, h, positions, meta, kv.k(cache_layer), kv.v(cache_layer), o);
    be_.add(x, o);
    be_.rmsnorm(x, layer.post_norm, eps, h);
    if (const auto* moe = std::get_if<MoeBlock>(&layer.mlp)) moe->forward(be_, cfg_, h, o);
    else std::get<SwigluMlp>(layer.mlp).forward(be_, h, o);
    be_.add(x, o);
  }

  Result<ForwardOutput> head(const ForwardBatch& batch, const Tensor& x_normed) {
    ForwardOutput out;
    const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
    if (R > 0) {
      Tensor rows = be_.upload(
          Tensor::view_of(const_cast<int32_t*>(batch.logit_rows.data()), DType::kI32, {R}));
      Tensor picked = be_.alloc(be_.activation_dtype(), {R, cfg_.d_model});
      be_.gather_rows(x_normed, rows, picked);
      out.logits = be_.alloc(DType::kF32, {R, cfg_.vocab_size});
      be_.linear(picked, lm_head_, nullptr, out.logits);
    }
    if (batch.want_hidden) out.hidden = x_normed;
    return out;
  }

  ModelConfig cfg_;
  backend::Backend& be_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<DecoderLayer> layers_;
  std::optional<MtpLayer> mtp_;
};

}  // namespace

std::vector<WeightSpec> glm4_moe_weight_table(const ModelConfig& c, bool include_mtp) {
  std::vector<WeightSpec> t;
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, c.d_model}, kFloat});
  t.push_back({"model.norm.weight", {c.d_model}, kFloat});
  // A tied checkpoint may still carry an lm_head copy; an untied one must have it.
  t.push_back({"lm_head.weight", {c.vocab_size, c.d_model}, kAny, /*optional=*/c.tie_word_embeddings, kLinear});
  for (int64_t l = 0; l < c.n_layers; ++l) add_decoder_layer(t, c, l, c.is_moe_layer(l));
  if (include_mtp) {
    const std::string p = layer_prefix(c.n_layers);
    t.push_back({p + "enorm.weight", {c.d_model}, kFloat});
    t.push_back({p + "hnorm.weight", {c.d_model}, kFloat});
    t.push_back({p + "eh_proj.weight", {c.d_model, 2 * c.d_model}, kAny, false, kLinear});
    t.push_back({p + "shared_head.norm.weight", {c.d_model}, kFloat});
    add_decoder_layer(t, c, c.n_layers, /*moe=*/true);
  }
  return t;
}

BindOptions glm4_moe_bind_options(const ModelConfig& c, bool include_mtp) {
  BindOptions o;
  const std::string p = layer_prefix(c.n_layers);
  // The MTP layer's optional copies of the head and embedding: the target's are used instead.
  o.ignored = {p + "shared_head.head.weight", p + "embed_tokens.weight"};
  // MTP layers the config declares but the caller chose not to load.
  if (!include_mtp)
    for (int64_t i = 0; i < c.n_mtp_layers; ++i) o.ignored_prefixes.push_back(layer_prefix(c.n_layers + i));
  o.quant = c.quant;
  return o;
}

Result<std::unique_ptr<CausalLM>> make_glm4_moe(const ModelConfig& cfg, const BoundWeights& weights,
                                                backend::Backend& be, bool include_mtp) {
  if (cfg.quant && cfg.quant->activations_quantized) {
    MX_LOG(kWarn) << cfg.source << ": quantization_config quantizes input activations too (quant_method "
                  << quant::quant_method_name(cfg.quant->method)
                  << "); mxserve dequantizes the weights and keeps activations in full precision (not emulated)";
  }
  WeightLoader wl(be, weights);
  return make_glm4_moe(cfg, wl, be, include_mtp);
}

Result<std::unique_ptr<CausalLM>> make_glm4_moe(const ModelConfig& cfg, WeightLoader& wl, backend::Backend& be,
                                                bool include_mtp) {
  auto model = std::make_unique<Glm4MoeModel>(cfg, be);
  MX_RETURN_IF_ERROR(model->load(wl, include_mtp));
  return std::unique_ptr<CausalLM>(std::move(model));
}

}  // namespace mxserve::model
