// DecoderFrameBase: the attention-independent part of the decoder frame (decoder_frame.h).
#include "model/archs/decoder_frame.h"

namespace mxserve::model {

std::string decoder_layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

DecoderFrameBase::DecoderFrameBase(const ModelConfig& cfg, backend::Backend& be, const parallel::RankLayout& rank,
                                   parallel::Communicator* comm, parallel::Communicator* moe_comm)
    : cfg_(cfg), attn_cfg_(cfg), be_(be), tp_(be, rank, comm),
      dp_moe_{rank.dp_attention ? moe_comm : nullptr, rank.dp_attention && rank.tp > 1 ? comm : nullptr} {}

Status DecoderFrameBase::check_batch(const ForwardBatch& batch, kvcache::KvCache& kv) const {
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

Result<DecoderFrameBase::Uploaded> DecoderFrameBase::upload_batch(const ForwardBatch& batch, kvcache::KvCache& kv) {
  const int64_t T = batch.n_tokens();
  Uploaded u;
  u.ids = tp_.upload_ids(batch);  // TP: rows of this rank's vocabulary slice; other ranks' ids -> the zero row
  u.positions = be_.upload(Tensor::view_of(const_cast<int32_t*>(batch.positions.data()), DType::kI32, {T}));
  kernels::AttentionParams ap;  // paging + tree rows; the shape fields from the architecture
  attention_shape(ap);
  MX_ASSIGN_OR_RETURN(u.meta, build_attention_meta(batch, be_, kv.spec().block_size, ap, kv.block_tables()));
  return u;
}

Status DecoderFrameBase::check_bound_part(int64_t layer, const ForwardBatch& batch, kvcache::KvCache& kv) const {
  MX_RETURN_IF_ERROR(check_batch(batch, kv));
  if (dp_moe_.enabled()) return unsupported("bind_layer_part with DP attention (its MoE blocks exchange tokens)");
  if (layer < 0 || layer >= cfg_.n_layers)
    return invalid_argument("bind_layer_part: layer " + std::to_string(layer) + " of " +
                            std::to_string(cfg_.n_layers));
  return Status::ok();
}

void DecoderFrameBase::load_head(WeightLoader& wl) {
  tp_.load_vocab(wl, cfg_);  // TP: embed_tokens / lm_head, this rank's vocabulary rows
  tp_.set_fused_add_norm(wl.fused_add_norm());  // TP: the fused all-reduce + add + RMSNorm, when the launch made one
  final_norm_ = wl.get(decl::replicated("model.norm.weight", {cfg_.d_model}));
}

DecoderMlp DecoderFrameBase::load_mlp(WeightLoader& wl, const std::string& prefix, bool moe) {
  if (moe) return MoeBlock::load(wl, prefix, cfg_);
  return SwigluMlp::load(wl, prefix, cfg_.d_model, cfg_.dense_inter);
}

MtpHead DecoderFrameBase::load_mtp_head(WeightLoader& wl) {
  const int64_t H = cfg_.d_model;
  const std::string p = decoder_layer_prefix(cfg_.n_layers);
  // The MTP layer's optional copies of the head and embedding: the target's are used instead.
  wl.ignore(p + "shared_head.head.weight");
  wl.ignore(p + "embed_tokens.weight");
  MtpHead m;
  m.enorm = wl.get(decl::replicated(p + "enorm.weight", {H}));
  m.hnorm = wl.get(decl::replicated(p + "hnorm.weight", {H}));
  m.shared_head_norm = wl.get(decl::replicated(p + "shared_head.norm.weight", {H}));
  const WeightSpec eh_proj = decl::linear(p + "eh_proj.weight", H, 2 * H, parallel::ShardAxis::kNone);
  m.eh_proj_e = wl.columns(eh_proj, 0, H);
  m.eh_proj_h = wl.columns(eh_proj, H, 2 * H);
  return m;
}

void DecoderFrameBase::ignore_mtp_layers(WeightLoader& wl) {
  for (int64_t i = 0; i < cfg_.n_mtp_layers; ++i) wl.ignore_prefix(decoder_layer_prefix(cfg_.n_layers + i));
}

Result<Tensor> DecoderFrameBase::mtp_input(const MtpHead& m, const Tensor& ids, const Tensor& hidden_in) {
  const int64_t T = hidden_in.dim(0);
  const DType act = be_.activation_dtype();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  Tensor e = be_.alloc(act, {T, cfg_.d_model});
  MX_RETURN_IF_ERROR(tp_.embed(ids, e));  // TP: vocabulary-parallel embedding
  be_.rmsnorm(e, m.enorm, eps, e);
  Tensor h = be_.alloc(act, {T, cfg_.d_model});
  be_.rmsnorm(hidden_in, m.hnorm, eps, h);
  Tensor x = be_.alloc(act, {T, cfg_.d_model});
  Tensor xh = be_.alloc(act, {T, cfg_.d_model});
  be_.linear(e, m.eh_proj_e, nullptr, x);  // eh_proj(cat(e, h)) = e @ We^T + h @ Wh^T
  be_.linear(h, m.eh_proj_h, nullptr, xh);
  be_.add(x, xh);
  return x;
}

Status DecoderFrameBase::mlp_half(const Tensor& post_norm, const DecoderMlp& mlp, Tensor& x) {
  Tensor h = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
  Tensor o = be_.alloc(be_.activation_dtype(), {x.dim(0), cfg_.d_model});
  be_.rmsnorm(x, post_norm, static_cast<float>(cfg_.rms_norm_eps), h);
  MX_RETURN_IF_ERROR(dp_moe_.mlp(be_, cfg_, mlp, tp_, h, o));  // TP / DP attention
  be_.add(x, o);
  return Status::ok();
}

Result<ForwardOutput> DecoderFrameBase::idle_forward(const std::vector<const MoeBlock*>& blocks) {
  MX_RETURN_IF_ERROR(dp_moe_.idle(be_, cfg_, blocks));
  return ForwardOutput{};
}

}  // namespace mxserve::model
