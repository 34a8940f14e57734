// glm4_moe, exactly as transformers 5.17 computes it (research/models-formats.md section 1): the decoder
// frame (decoder_frame.h: layer loop, MLP / MoE blocks, MTP head, collectives) filled with GQA attention
// (q/k/v with optional bias and q/k norm, partial RoPE, paged K/V cache, optionally FP8) and decode graphs.
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
#include <cmath>
#include <memory>

#include "model/archs/decoder_frame.h"
#include "model/layers/blocks.h"

namespace mxserve::model {
namespace {

// The frame (decoder_frame.h) filled with GQA attention over a K/V cache.
class Glm4MoeModel final : public DecoderFrame<GqaAttention> {
 public:
  // attn_cfg_ is cfg with this rank's head counts.
  Glm4MoeModel(const ModelConfig& cfg, backend::Backend& be, const parallel::RankLayout& rank,
               parallel::Communicator* comm, parallel::Communicator* moe_comm)
      : DecoderFrame(cfg, be, rank, comm, moe_comm) {
    attn_cfg_.n_heads = cfg.n_heads / rank.tp;  // the launch checked tp divides them
    attn_cfg_.n_kv_heads = std::max<int64_t>(1, cfg.n_kv_heads / rank.tp);  // replicated when tp > n_kv_heads
  }

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

  Status forward_device(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& device_meta,
                        kvcache::KvCache& kv, Tensor& logits, Tensor* hidden = nullptr) override {
    // tp > 1 runs under a lockstep model's joined capture (launch/lockstep_model.h). DP attention: the MoE
    // exchange's row counts are captured as they are now; the lockstep model gives every DP group the same padded
    // slot range at every replay (launch/dp_graph_step.h), so they are the same each time.
    const int64_t T = ids.numel();
    if (positions.numel() != T || device_meta.params.n_tokens != T || logits.ndim() != 2 || logits.dim(0) != T ||
        logits.dim(1) != cfg_.vocab_size ||
        (hidden != nullptr && (hidden->ndim() != 2 || hidden->dim(0) != T || hidden->dim(1) != cfg_.d_model)))
      return invalid_argument("forward_device: " + std::to_string(T) + " ids, " + std::to_string(positions.numel()) +
                              " positions, attention metadata for " + std::to_string(device_meta.params.n_tokens) +
                              " rows, logits " + logits.describe() +
                              (hidden != nullptr ? ", hidden " + hidden->describe() : std::string()));
    backend::AttentionMeta meta = device_meta;
    attention_shape(meta.params);
    std::monostate state;
    return device_body(ids, positions, meta, kv, state, logits, hidden);
  }

 private:
  GqaAttention load_attention(WeightLoader& wl, const std::string& prefix, int64_t) override {
    return GqaAttention::load(wl, prefix, cfg_);
  }

  void attention_shape(kernels::AttentionParams& ap) const override {
    ap.n_heads = static_cast<int32_t>(attn_cfg_.n_heads);  // this rank's heads (tensor parallel)
    ap.n_kv_heads = static_cast<int32_t>(attn_cfg_.n_kv_heads);
    ap.head_dim = static_cast<int32_t>(cfg_.head_dim);
    ap.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(cfg_.head_dim)));
  }

  Status attend(const GqaAttention& attn, const Tensor& h, const Tensor& positions, const backend::AttentionMeta& meta,
                kvcache::KvCache& kv, int64_t cache_layer, std::monostate&, Tensor& o) override {
    attn.forward(be_, attn_cfg_, h, positions, meta, kv.k(cache_layer), kv.v(cache_layer),
                 kv.scales_if_any(cache_layer, kvcache::CacheRole::kKey),
                 kv.scales_if_any(cache_layer, kvcache::CacheRole::kValue), o);
    return Status::ok();
  }

  kvcache::KvCacheDtype kv_dtype_ = kvcache::KvCacheDtype::kAuto;
};

Result<std::unique_ptr<CausalLM>> build_glm4_moe(const ModelConfig& cfg, WeightLoader& wl, backend::Backend& be,
                                                 bool include_mtp) {
  auto model = std::make_unique<Glm4MoeModel>(cfg, be, wl.rank(), wl.communicator(),
                                              wl.moe_communicator());
  MX_RETURN_IF_ERROR(model->load(wl, include_mtp));
  return std::unique_ptr<CausalLM>(std::move(model));
}

// bench-model's cost of one GQA attention part (w weight bytes, a activation bytes, T rows; kvd = n_kv_heads
// head_dim, qd = n_heads head_dim; an FP8 cache element is 1 byte + one f32 scale per head_dim of them):
//   bytes = w (every declared self_attn weight) + KV read (2 kvd per cached token, every sequence's context
//           once) + KV write (2 kvd per token) + a T (4 H + 4 qd + 4 kvd)  [norm in/out, residual in/out,
//           q/k/v/attn out written + read]
//   FLOPs = 2 T (Linear params) + 4 qd sum_t(keys attended by t)
AttentionCost gqa_attention_cost(const ModelConfig& c, const CostUnits& u) {
  const double a = u.act_bytes, H = static_cast<double>(c.d_model);
  const double qd = static_cast<double>(c.n_heads * c.head_dim), kvd = static_cast<double>(c.n_kv_heads * c.head_dim);
  const double attn_w = static_cast<double>(u.attn_dense_params) * u.weight_bytes;
  const double matmul = static_cast<double>(u.attn_matmul_params);
  const double kv_elem = u.fp8_kv ? 1.0 + 4.0 / static_cast<double>(c.head_dim) : a;
  auto bytes = [=](double T, double kv_tokens) {
    return attn_w + 2 * kvd * kv_elem * kv_tokens + 2 * kvd * kv_elem * T + a * T * (4 * H + 4 * qd + 4 * kvd);
  };
  auto flops = [=](double T, double keys) { return 2 * T * matmul + 4 * qd * keys; };
  AttentionCost cost;
  cost.decode = [=](double b, double ctx) { return PartCost{bytes(b, b * ctx), flops(b, b * ctx)}; };
  cost.prefill = [=](double p) { return PartCost{bytes(p, p), flops(p, p * (p + 1) / 2)}; };
  return cost;
}

}  // namespace

const ArchitectureDef& glm4_moe_architecture() {
  static const ArchitectureDef d = [] {
    ArchitectureDef a;
    a.hf_name = "Glm4MoeForCausalLM";
    a.model_type = "glm4_moe";
    a.default_partial_rotary_factor = 0.5;  // transformers' Glm4MoeConfig
    a.build = &build_glm4_moe;
    a.capabilities = {.tensor_parallel = true, .expert_parallel = true, .dp_attention = true};
    a.attention_cost = &gqa_attention_cost;
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
