// glm_moe_dsa, as transformers 5.17 computes it (research/glm5-dsa.md): the decoder frame (decoder_frame.h)
// filled with MLA + DSA attention over a latent cache.
//   x = embed[ids]; per layer l: x += MLA_DSA_l(rmsnorm(x)); x += (dense MLP | MoE)(rmsnorm(x));
//   logits = lm_head(rmsnorm(x)). A "full" layer runs its indexer; a "shared" layer reuses the top-k of
//   the most recent full layer of the same forward. MTP layer L = n_layers (own full indexer, sparse MoE):
//   y = shared_head.norm(Layer_L(eh_proj(cat(enorm(embed(x_{t+1})), hnorm(h_t))))), logits = lm_head(y).
//   index_share_for_mtp_iteration: draft-chain steps >= 2 (ForwardBatch::mtp_step) attend over the
//   top-k the chain's first step (the MTP extend) computed instead of running the MTP indexer's scores again
//   (its keys are still written); the target's verification keeps the outputs exact.
// KV layout per cached layer: kLatent [kv_lora_rank + qk_rope_head_dim]; full layers (and the MTP layer)
// add kIndexerKey [index_head_dim]. Shared layers cache no indexer keys. With --kv-cache-dtype fp8_e4m3 both
// are packed FP8 rows (kernels/mla_fp8.h; docs/kv-cache.md).
// Tensor parallel (docs/parallel.md): each rank runs its attention heads (q_b / kv_b rows, o_proj columns),
// its slice of every MLP / expert width and its vocabulary rows; the latent cache, the indexer and its
// top-k are replicated. "TP:" marks the collectives -- all-reduces after the embedding, after o_proj and
// after the MLP / MoE, the logits all-gather, and (full indexer layers) the checks that the indexer's input
// and its top-k are the same on every rank.
// DP attention ("DP:", docs/parallel.md): attention runs whole per DP rank on its own latent cache; each MoE
// block exchanges tokens over the world (model/layers/dp_moe.h), an idle DP rank joining with 0 rows.
#include "model/archs/glm_moe_dsa.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "kernels/mla_fp8.h"
#include "model/archs/decoder_frame.h"
#include "model/archs/glm_moe_dsa_config.h"
#include "model/decisions.h"
#include "model/layers/mla_attention.h"

namespace mxserve::model {
namespace {

// What one forward carries from layer to layer: the DSA top-k.
struct DsaState {
  Tensor topk;                // i32 [T, index_topk]: written by full layers, read by shared ones
  bool reuse_topk = false;    // MTP draft-chain continuation: topk holds the first step's rows (no indexer run)
  bool check_replicas = true;  // TP: check the indexer's input and top-k across ranks (off in bench parts)
};

// The frame (decoder_frame.h) filled with MLA + DSA attention over a latent cache.
class GlmMoeDsaModel final : public DecoderFrame<MlaAttention, DsaState> {
 public:
  // attn_cfg_ is cfg with this rank's head count.
  GlmMoeDsaModel(const ModelConfig& cfg, backend::Backend& be, backend::MlaDsaOps& ops,
                 const parallel::RankLayout& rank, parallel::Communicator* comm, parallel::Communicator* moe_comm)
      : DecoderFrame(cfg, be, rank, comm, moe_comm), dsa_(glm_moe_dsa_config(cfg)), ops_(ops) {
    attn_cfg_.n_heads = cfg.n_heads / rank.tp;  // the launch checked tp divides them
    attn_cfg_.n_kv_heads = attn_cfg_.n_heads;   // MLA: one "KV head" per query head (decompressed)
  }

  // --kv-cache-dtype fp8_e4m3: both tensors hold packed FP8 rows u8 [n_slots, bytes] (kernels/mla_fp8.h):
  // latent = kv_lora_rank e4m3 + f32 scale per 128 + qk_rope_dim bf16 (656 bytes at GLM-5.x's 512 / 64),
  // indexer key = index_head_dim e4m3 + f32 scale per 128 (132 bytes at 128).
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    kvcache::KvCacheSpec s;
    s.n_blocks = n_blocks;
    s.block_size = block_size;
    const bool fp8 = kv_dtype_ == kvcache::KvCacheDtype::kFp8E4M3;
    const DType dt = fp8 ? DType::kU8 : be_.activation_dtype();
    const int64_t latent_width =
        fp8 ? kernels::mla_fp8_row_bytes(dsa_.kv_lora_rank, dsa_.qk_rope_dim) : dsa_.cache_width();
    const int64_t index_width = fp8 ? kernels::mla_fp8_row_bytes(dsa_.index_head_dim, 0) : dsa_.index_head_dim;
    for (int64_t l = 0; l < cfg_.n_layers + (mtp_ ? 1 : 0); ++l) {
      kvcache::CacheLayerSpec layer;
      layer.tensors.push_back({kvcache::CacheRole::kLatent, latent_width, dt});
      if (l >= cfg_.n_layers || dsa_.full_indexer[l])
        layer.tensors.push_back({kvcache::CacheRole::kIndexerKey, index_width, dt});
      s.layers.push_back(std::move(layer));
    }
    return s;
  }
  // FP8 needs rows the packed layout can align (f32 scales on 4-byte, bf16 rope on 2-byte boundaries).
  Status set_kv_cache_dtype(kvcache::KvCacheDtype dtype) override {
    if (dtype == kvcache::KvCacheDtype::kFp8E4M3) {
      if (!kernels::mla_fp8_shape_ok(dsa_.kv_lora_rank, dsa_.qk_rope_dim))
        return unsupported(cfg_.source + ": --kv-cache-dtype fp8_e4m3 needs kv_lora_rank a multiple of 4 and an even "
                                         "qk_rope_head_dim (packed FP8 latent rows); got kv_lora_rank " +
                           std::to_string(dsa_.kv_lora_rank) + ", qk_rope_head_dim " + std::to_string(dsa_.qk_rope_dim) +
                           " -- use --kv-cache-dtype auto");
      if (!kernels::mla_fp8_shape_ok(dsa_.index_head_dim, 0))
        return unsupported(cfg_.source + ": --kv-cache-dtype fp8_e4m3 needs index_head_dim a multiple of 4 (packed FP8 "
                                         "indexer keys); got " + std::to_string(dsa_.index_head_dim) +
                           " -- use --kv-cache-dtype auto");
    }
    kv_dtype_ = dtype;
    return Status::ok();
  }
  kvcache::KvCacheDtype kv_cache_dtype() const override { return kv_dtype_; }

  // Decode graphs (runtime/decode_graphs.h): the target forward over inputs already on the device, captured
  // per (batch bucket, context class). The MLA + DSA decode path is capturable as it stands (the audit is in
  // docs/design/cuda-graphs.md, "glm_moe_dsa"): every kernel reads token_seq / kv_index / slot_mapping /
  // block_tables / positions from device memory; the top-k buffer and the indexer / attention workspaces come
  // from Backend::alloc (the graph-private pool while capturing) sized by T (the bucket) and
  // AttentionParams::max_kv_len (the class bound); the indexer grid and the MLA split plan depend only on
  // those and on index_topk (tp > 1 and DP are captured jointly by the lockstep model, DP with static padded
  // row counts per group). What is not capturable is refused here or off: the TP replica checks (host compares;
  // off), an installed decision hook (host callbacks). Chain and tree verify steps (several rows per sequence; a
  // tree's mask / base in device buffers the graph owns) run the same body; `hidden` receives the post-norm
  // rows the MTP layer reads.
  Status forward_device(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& device_meta,
                        kvcache::KvCache& kv, Tensor& logits, Tensor* hidden = nullptr) override {
    // tp > 1 runs under a lockstep model's joined capture (launch/lockstep_model.h). DP attention: the MoE
    // exchange's row counts are captured as they are now; the lockstep model gives every DP group the same padded
    // slot range at every replay (launch/dp_graph_step.h), so they are the same each time.
    if (active_decision_hook() != nullptr)
      return unsupported("forward_device (CUDA graph capture) with a decision hook installed (its callbacks run on "
                         "the host)");
    const int64_t T = ids.numel();
    if (positions.numel() != T || device_meta.params.n_tokens != T ||
        device_meta.params.max_kv_len <= 0 || logits.ndim() != 2 || logits.dim(0) != T ||
        logits.dim(1) != cfg_.vocab_size ||
        (hidden != nullptr && (hidden->ndim() != 2 || hidden->dim(0) != T || hidden->dim(1) != cfg_.d_model)))
      return invalid_argument("forward_device: " + std::to_string(T) + " ids, " + std::to_string(positions.numel()) +
                              " positions, attention metadata for " + std::to_string(device_meta.params.n_tokens) +
                              " rows (max_kv_len " + std::to_string(device_meta.params.max_kv_len) + "), logits " +
                              logits.describe() + (hidden != nullptr ? ", hidden " + hidden->describe() : "") +
                              " (decode or verify rows with a context bound expected)");
    backend::AttentionMeta meta = device_meta;
    attention_shape(meta.params);
    DsaState state = make_state(T, /*bound_part=*/false);
    // The TP replica checks compare on the host (not capturable): off in graphs; the eager steps keep them.
    state.check_replicas = false;
    return device_body(ids, positions, meta, kv, state, logits, hidden);
  }

  // MTP graphs (runtime/mtp_graphs.h): an MTP step on the device. Under index_share_for_mtp_iteration a
  // chain continuation attends over chain_topk_ (the first step's top-k rows, staged there by stage_mtp_chain
  // before the replay) instead of running the MTP indexer's scores (the indexer keys are still written), and
  // an extend writes its top-k into extend_topk_ (commit_mtp_extend makes it the first step's); tree rows run
  // the indexer. Refused as forward_device is: a decision hook (host callbacks); tp / DP in the frame.
  Status forward_mtp_device(const Tensor& ids, const Tensor& positions, const Tensor& hidden_in,
                            const backend::AttentionMeta& meta, kvcache::KvCache& kv, Tensor& logits,
                            Tensor& hidden_out, MtpDeviceRows rows = MtpDeviceRows::kChainContinuation) override {
    if (active_decision_hook() != nullptr)
      return unsupported("forward_mtp_device (MTP graph capture) with a decision hook installed (its callbacks run "
                         "on the host)");
    return DecoderFrame::forward_mtp_device(ids, positions, hidden_in, meta, kv, logits, hidden_out, rows);
  }
  Status reserve_mtp_extend(int64_t max_rows) override {
    if (!dsa_.index_share_for_mtp_iteration || max_rows <= 0) return Status::ok();
    if (extend_topk_.defined() && extend_topk_.dim(0) >= max_rows) return Status::ok();
    extend_topk_ = be_.upload(Tensor::zeros(DType::kI32, {max_rows, dsa_.index_topk}));
    return Status::ok();
  }
  Status commit_mtp_extend(int64_t n_rows) override {
    if (!dsa_.index_share_for_mtp_iteration) return Status::ok();
    if (!extend_topk_.defined() || n_rows <= 0 || n_rows > extend_topk_.dim(0))
      return invalid_argument("commit_mtp_extend: " + std::to_string(n_rows) + " rows of a first-step top-k of " +
                              std::to_string(extend_topk_.defined() ? extend_topk_.dim(0) : 0) +
                              " rows (reserve_mtp_extend first)");
    first_step_topk_ = extend_topk_.slice_rows(0, n_rows);  // as end_mtp leaves an eager extend's
    return Status::ok();
  }
  Status reserve_mtp_chain(int64_t max_rows) override {
    if (!dsa_.index_share_for_mtp_iteration || max_rows <= 0) return Status::ok();
    if (chain_topk_.defined() && chain_topk_.dim(0) >= max_rows) return Status::ok();
    // Zero rows: a padded row (kv index 0) sees only key 0 whatever it holds; zeros keep every entry valid.
    chain_topk_ = be_.upload(Tensor::zeros(DType::kI32, {max_rows, dsa_.index_topk}));
    return Status::ok();
  }
  Status stage_mtp_chain(const MtpStep& step, const Tensor& first_step_rows) override {
    if (!dsa_.index_share_for_mtp_iteration) return Status::ok();
    const int64_t n = static_cast<int64_t>(step.first_step_rows.size());
    MX_RETURN_IF_ERROR(step.validate(n, first_step_topk_.defined() ? first_step_topk_.dim(0) : 0));
    if (!chain_topk_.defined() || chain_topk_.dim(0) < n || first_step_rows.numel() != n)
      return invalid_argument("stage_mtp_chain: " + std::to_string(n) + " mtp_first_step_rows (" +
                              std::to_string(first_step_rows.numel()) + " on the device) for a staged top-k of " +
                              std::to_string(chain_topk_.defined() ? chain_topk_.dim(0) : 0) +
                              " rows (reserve_mtp_chain first)");
    Tensor dst = chain_topk_.slice_rows(0, n);
    be_.gather_rows(first_step_topk_, first_step_rows, dst);
    return Status::ok();
  }

 private:
  // The MTP layer (layer n_layers) has its own full indexer.
  MlaAttention load_attention(WeightLoader& wl, const std::string& prefix, int64_t layer) override {
    return MlaAttention::load(wl, prefix, cfg_, layer >= cfg_.n_layers || dsa_.full_indexer[layer]);
  }

  void attention_shape(kernels::AttentionParams& ap) const override {
    // Paging + tree rows; the MLA / indexer shapes travel in their own params.
    ap.n_heads = static_cast<int32_t>(attn_cfg_.n_heads);  // this rank's heads
    ap.n_kv_heads = 1;
    ap.head_dim = static_cast<int32_t>(dsa_.cache_width());
    ap.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dsa_.qk_head_dim())));
  }

  DsaState make_state(int64_t T, bool bound_part) override {
    DsaState s;
    s.topk = be_.alloc(DType::kI32, {T, dsa_.index_topk});
    s.check_replicas = !bound_part;
    return s;
  }

  Status attend(const MlaAttention& attn, const Tensor& h, const Tensor& positions, const backend::AttentionMeta& meta,
                kvcache::KvCache& kv, int64_t cache_layer, DsaState& state, Tensor& o) override {
    const bool checks = attn.indexer && !state.reuse_topk && state.check_replicas;
    if (checks)  // TP: the indexer's input (and through replicated q_a, its query latent)
      MX_RETURN_IF_ERROR(tp_.check_replicated(h, "the DSA indexer input of layer " + std::to_string(cache_layer)));
    Tensor* index_keys = attn.indexer ? &kv.tensor(cache_layer, kvcache::CacheRole::kIndexerKey) : nullptr;
    attn.forward(be_, ops_, attn_cfg_, h, positions, meta, kv.tensor(cache_layer, kvcache::CacheRole::kLatent),
                 index_keys, state.topk, o, state.reuse_topk);
    if (checks)  // TP: the replicated indexer must pick the same keys on every rank
      MX_RETURN_IF_ERROR(tp_.check_replicated(state.topk, "the DSA top-k of layer " + std::to_string(cache_layer)));
    return Status::ok();
  }

  // index_share_for_mtp_iteration: a draft-chain continuation (batch.mtp_step) takes the top-k rows the
  // chain's first MTP step computed (first_step_topk_) and skips the MTP indexer's scores; otherwise the
  // indexer runs. Rows outside the stored first step are an error naming them.
  Status begin_mtp(const ForwardBatch& batch, DsaState& state) override {
    const MtpStep& step = batch.mtp_step;
    if (!step.continues_chain() || !dsa_.index_share_for_mtp_iteration) return Status::ok();
    MX_RETURN_IF_ERROR(step.validate(batch.n_tokens(), first_step_topk_.defined() ? first_step_topk_.dim(0) : 0));
    Tensor dev_rows = be_.upload(Tensor::view_of(const_cast<int32_t*>(step.first_step_rows.data()), DType::kI32,
                                                 {batch.n_tokens()}));
    be_.gather_rows(first_step_topk_, dev_rows, state.topk);
    state.reuse_topk = true;
    return Status::ok();
  }
  void end_mtp(const DsaState& state) override {
    if (!state.reuse_topk) first_step_topk_ = state.topk;
  }
  Status begin_mtp_device(int64_t T, MtpDeviceRows rows, DsaState& state) override {
    state.check_replicas = false;  // one rank (the frame refuses tp / DP): nothing to compare, no host copy
    if (!dsa_.index_share_for_mtp_iteration) return Status::ok();  // the MTP indexer runs in the graph
    if (rows == MtpDeviceRows::kTree) return Status::ok();         // tree steps recompute the top-k
    if (rows == MtpDeviceRows::kExtend) {  // the indexer runs; its top-k lands where continuations read it
      if (!extend_topk_.defined() || extend_topk_.dim(0) < T)
        return invalid_argument("forward_mtp_device: an extend of " + std::to_string(T) +
                                " rows writes a first-step top-k of " +
                                std::to_string(extend_topk_.defined() ? extend_topk_.dim(0) : 0) +
                                " rows (reserve_mtp_extend first)");
      state.topk = extend_topk_.slice_rows(0, T);
      return Status::ok();
    }
    if (!chain_topk_.defined() || chain_topk_.dim(0) < T)
      return invalid_argument("forward_mtp_device: index_share_for_mtp_iteration reads a staged top-k of " +
                              std::to_string(chain_topk_.defined() ? chain_topk_.dim(0) : 0) + " rows for " +
                              std::to_string(T) + " rows (reserve_mtp_chain first)");
    state.topk = chain_topk_.slice_rows(0, T);
    state.reuse_topk = true;
    return Status::ok();
  }

  GlmMoeDsaConfig dsa_;
  backend::MlaDsaOps& ops_;  // the same backend's MLA / DSA ops
  kvcache::KvCacheDtype kv_dtype_ = kvcache::KvCacheDtype::kAuto;  // --kv-cache-dtype
  // i32 [T, index_topk]: the MTP layer's top-k of the latest forward_mtp that ran its indexer (a draft chain's
  // first step), reused by the chain's later steps under index_share_for_mtp_iteration.
  Tensor first_step_topk_;
  // i32 [max_rows, index_topk], persistent (reserve_mtp_chain): MTP graphs' continuation rows read their chain's
  // first-step top-k here; stage_mtp_chain gathers rows of first_step_topk_ into it before each replay.
  Tensor chain_topk_;
  // i32 [max_rows, index_topk], persistent (reserve_mtp_extend): MTP extend graphs write their top-k here;
  // commit_mtp_extend points first_step_topk_ at its real rows.
  Tensor extend_topk_;
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
  auto model =
      std::make_unique<GlmMoeDsaModel>(cfg, be, *ops, wl.rank(), wl.communicator(), wl.moe_communicator());
  MX_RETURN_IF_ERROR(model->load(wl, include_mtp));
  return std::unique_ptr<CausalLM>(std::move(model));
}

// bench-model's cost of one MLA + DSA attention part. Cache row = latent + rope key (L = kv_lora_rank +
// qk_rope_dim), plus an indexer key of D_i = index_head_dim on full-indexer layers; K = index_topk;
// n_att(ctx) = min(ctx, K); w weight bytes, a activation bytes, T rows:
//   bytes = w (every declared self_attn weight) + a (L n_att + D_i ctx) per decode row (prefill: every cached
//           row once) + a T (L + D_i) [cache write] + a T (4 H + 4 n_heads (qk_head_dim + v_dim))
//   FLOPs = 2 T (Linear params) + 2 n_heads (L + kv_lora_rank) sum_t n_att(t)  [absorbed scores + P V]
//           + 2 index_n_heads D_i sum_t ctx(t)                              [indexer scores]
AttentionCost mla_attention_cost(const ModelConfig& c, const CostUnits& u) {
  const GlmMoeDsaConfig& dsa = glm_moe_dsa_config(c);
  const double a = u.act_bytes, H = static_cast<double>(c.d_model);
  const double attn_w = static_cast<double>(u.attn_dense_params) * u.weight_bytes;
  const double matmul = static_cast<double>(u.attn_matmul_params);
  const double L = static_cast<double>(dsa.cache_width()), Di = static_cast<double>(dsa.index_head_dim);
  const double R = static_cast<double>(dsa.kv_lora_rank), K = static_cast<double>(dsa.index_topk);
  const double heads = static_cast<double>(c.n_heads), head_width = static_cast<double>(dsa.qk_head_dim() + dsa.v_dim);
  const double index_width = static_cast<double>(dsa.index_n_heads * dsa.index_head_dim);
  auto bytes = [=](double T, double latent_rows, double index_rows) {
    return attn_w + a * (L * latent_rows + Di * index_rows) + a * T * (L + Di) + a * T * (4 * H + 4 * heads * head_width);
  };
  auto flops = [=](double T, double attended, double indexed) {
    return 2 * T * matmul + 2 * heads * (L + R) * attended + 2 * index_width * indexed;
  };
  AttentionCost cost;
  cost.decode = [=](double b, double ctx) {
    return PartCost{bytes(b, b * std::min(ctx, K), b * ctx), flops(b, b * std::min(ctx, K), b * ctx)};
  };
  cost.prefill = [=](double p) {
    const double all = p * (p + 1) / 2;
    const double attended = p <= K ? all : K * (K + 1) / 2 + (p - K) * K;  // sum over t of min(t + 1, K)
    return PartCost{bytes(p, p, p), flops(p, attended, all)};
  };
  return cost;
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
    a.capabilities = {.tensor_parallel = true, .expert_parallel = true, .dp_attention = true};
    a.attention_cost = &mla_attention_cost;
    return a;
  }();
  return d;
}

std::vector<WeightSpec> glm_moe_dsa_weight_table(const ModelConfig& c, bool include_mtp) {
  return record_weights(glm_moe_dsa_architecture(), c, include_mtp).table;
}

}  // namespace mxserve::model
