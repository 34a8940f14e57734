#include "cli/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "model/archs/glm_moe_dsa_config.h"
#include "model/causal_lm.h"
#include "model/registry.h"

namespace mxserve::cli {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string kib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  return buf;
}

// The KV layout of one rank, as the architecture's kv_spec builds it (glm4_moe.cpp / glm_moe_dsa.cpp).
Result<kvcache::KvCacheSpec> rank_kv_spec(const model::ModelConfig& c, int tp, const MemoryOptions& o,
                                          std::vector<std::string>* notes) {
  const int64_t n_cached = c.n_layers + (o.mtp && c.n_mtp_layers > 0 ? 1 : 0);
  const std::string arch = c.arch != nullptr ? c.arch->hf_name : "";
  if (arch == "Glm4MoeForCausalLM") {
    const int64_t kv_heads = std::max<int64_t>(1, c.n_kv_heads / tp);
    if (o.kv_dtype == kvcache::KvCacheDtype::kFp8E4M3) return kvcache::KvCacheSpec::gqa_fp8(n_cached, 1, 1, kv_heads, c.head_dim);
    return kvcache::KvCacheSpec::gqa(n_cached, 1, 1, kv_heads, c.head_dim, DType::kBF16);
  }
  if (arch == "GlmMoeDsaForCausalLM") {
    const model::GlmMoeDsaConfig& d = model::glm_moe_dsa_config(c);
    if (o.kv_dtype == kvcache::KvCacheDtype::kFp8E4M3)
      notes->push_back("--kv-cache-dtype fp8_e4m3: this build's glm_moe_dsa caches the MLA latent in bf16 (the FP8 "
                       "latent is not built here), so the KV numbers are bf16's");
    kvcache::KvCacheSpec s;
    s.n_blocks = 1;
    s.block_size = 1;
    for (int64_t l = 0; l < n_cached; ++l) {
      kvcache::CacheLayerSpec layer;
      layer.tensors.push_back({kvcache::CacheRole::kLatent, d.cache_width(), DType::kBF16});
      if (l >= c.n_layers || d.full_indexer[l])
        layer.tensors.push_back({kvcache::CacheRole::kIndexerKey, d.index_head_dim, DType::kBF16});
      s.layers.push_back(std::move(layer));
    }
    return s;
  }
  return unsupported("mxserve memory: the KV layout of " + arch + " (" + c.source +
                     ") is not known here (glm4_moe and glm_moe_dsa are)");
}

}  // namespace

uint64_t stored_weight_bytes(const model::WeightSpec& spec, const Shape& shape, const model::SyntheticPlan& plan) {
  const uint64_t n = static_cast<uint64_t>(shape_numel(shape));
  if (ends_with(spec.name, "e_score_correction_bias")) return 4 * n;  // kept in f32
  const std::string scheme = model::synthetic_scheme(plan, spec.name);
  const uint64_t cols = shape.empty() ? 1 : static_cast<uint64_t>(shape.back());
  const uint64_t rows = cols == 0 ? 0 : n / cols;
  if (scheme == "mxfp4") return rows * ((cols + 1) / 2) + rows * ((cols + 31) / 32);  // codes + e8m0 per 32
  if (scheme == "fp8-block") return n + 4 * ((rows + 127) / 128) * ((cols + 127) / 128);  // codes + f32 per 128^2
  return 2 * n;  // bf16
}

Result<MemoryPlan> plan_memory(const model::ModelConfig& c, const parallel::ParallelConfig& p,
                               const model::SyntheticPlan& plan, const MemoryOptions& o) {
  MX_RETURN_IF_ERROR(p.validate());
  MX_ASSIGN_OR_RETURN(std::vector<parallel::RankLayout> ranks, p.ranks());
  MemoryPlan m;
  m.world = p.world();
  m.layout = "tp " + std::to_string(p.tp) + (p.dp > 1 ? " x dp " + std::to_string(p.dp) : "") +
             (p.dp_attention ? " (DP attention)" : "") + (p.ep > 1 ? ", ep " + std::to_string(p.ep) : "");
  const auto declared = model::declared_weights(c, o.mtp && c.n_mtp_layers > 0);
  for (const model::WeightSpec& s : declared)
    if (!s.optional) m.weight_bytes_total += stored_weight_bytes(s, s.shape, plan);
  m.weight_bytes_min = UINT64_MAX;
  for (const parallel::RankLayout& r : ranks) {
    auto table = model::shard_weight_table(declared, r);
    if (!table.is_ok()) return table.status().with_context(r.describe());
    uint64_t bytes = 0;
    for (const model::WeightSpec& s : *table)
      if (!s.optional) bytes += stored_weight_bytes(s, s.shape, plan);
    m.weight_bytes_max = std::max(m.weight_bytes_max, bytes);
    m.weight_bytes_min = std::min(m.weight_bytes_min, bytes);
  }
  MX_ASSIGN_OR_RETURN(kvcache::KvCacheSpec kv, rank_kv_spec(c, p.tp, o, &m.notes));
  m.kv_bytes_per_token = kv.bytes_per_block();
  if (o.gpu_bytes > 0) {
    const double budget = static_cast<double>(o.gpu_bytes) * o.gpu_utilization - static_cast<double>(m.weight_bytes_max);
    m.fits = budget > 0;
    m.kv_budget_bytes = m.fits ? static_cast<uint64_t>(budget) : 0;
    m.kv_tokens_per_rank = m.fits ? static_cast<int64_t>(m.kv_budget_bytes / m.kv_bytes_per_token) : 0;
    m.kv_tokens_total = m.kv_tokens_per_rank * p.dp;
  }

  // Links, per decode token per rank (ring). Counts follow the forward's collectives (docs/parallel.md).
  const double H = static_cast<double>(c.d_model) * o.act_bytes;
  const int64_t L = c.n_layers + (o.mtp && c.n_mtp_layers > 0 ? 1 : 0);
  const int64_t moe_layers = L - std::min<int64_t>(c.first_k_dense, c.n_layers);
  const int64_t dense_layers = L - moe_layers;
  const int tp = p.tp, world = p.world();
  const double ring_tp = tp > 1 ? 2.0 * (tp - 1) / tp : 0.0;
  LinkBytes& lb = m.links;
  lb.all_reduce_payload = H;
  if (tp > 1) {
    // embedding + o_proj per layer + dense MLP per dense layer + (without DP attention) the MoE block per MoE layer
    lb.tp_all_reduces = 1 + L + dense_layers + (p.dp_attention ? 0 : moe_layers);
    lb.tp_all_reduce_bytes = static_cast<double>(lb.tp_all_reduces) * ring_tp * H;
    lb.logits_bytes = static_cast<double>(tp - 1) / tp * static_cast<double>(c.vocab_size) * 4.0;
  }
  if (p.dp_attention && world > 1) {
    // all-gather + reduce-scatter of the token's row over the world per MoE layer; with tp > 1 each group's ranks
    // also all-gather their tokens' rows (one H row, (tp-1)/tp of it sent per rank).
    lb.moe_exchange_bytes = static_cast<double>(moe_layers) *
                            (2.0 * (world - 1) / world * H + (tp > 1 ? static_cast<double>(tp - 1) / tp * H : 0.0));
  }
  if (p.ep > 1 && c.n_experts > 0) {
    // Dispatch + combine: the row goes to each other ep rank that holds one of its top_k experts and a combined
    // row comes back; with uniform routing a rank is hit with probability 1 - (1 - 1/ep)^top_k.
    const double hit = 1.0 - std::pow(1.0 - 1.0 / p.ep, static_cast<double>(c.top_k));
    lb.all_to_all_bytes = static_cast<double>(moe_layers) * 2.0 * (p.ep - 1) * hit * H;
    m.notes.push_back("EP as built sends no extra bytes (each rank's experts add a partial sum into the " +
                      std::string(p.dp_attention ? "DP-attention reduce-scatter" : "tp all-reduce") +
                      "); the all-to-all dispatch / combine line is the alternative, not built");
  }
  if (o.mtp && c.n_mtp_layers > 0)
    m.notes.push_back("MTP: the weights and KV include the MTP layer; each draft step adds that layer's collectives");
  m.notes.push_back("weights as stored on the GPU (bf16 / MXFP4 / FP8-block codes and scales); activations, CUDA "
                    "graphs and NCCL buffers must fit in the " + std::to_string(static_cast<int>(std::lround((1 - o.gpu_utilization) * 100))) +
                    "% left out of --gpu-memory");
  return m;
}

std::string format_memory_plan(const MemoryPlan& m, const MemoryOptions& o) {
  std::string s = "layout: " + m.layout + ", " + std::to_string(m.world) + " GPU(s)\n";
  s += "weights per GPU: " + gib(static_cast<double>(m.weight_bytes_max)) +
       (m.weight_bytes_min != m.weight_bytes_max ? " (fullest rank; emptiest " + gib(static_cast<double>(m.weight_bytes_min)) + ")" : "") +
       "  [whole model " + gib(static_cast<double>(m.weight_bytes_total)) + "]\n";
  s += "KV cache per token per GPU: " + std::to_string(m.kv_bytes_per_token) + " B" +
       (o.kv_dtype == kvcache::KvCacheDtype::kFp8E4M3 ? " (fp8_e4m3)" : " (bf16)") + "\n";
  if (o.gpu_bytes > 0) {
    if (!m.fits) {
      s += "does NOT fit: " + gib(static_cast<double>(m.weight_bytes_max)) + " of weights > " +
           gib(static_cast<double>(o.gpu_bytes) * o.gpu_utilization) + " (--gpu-memory x --gpu-memory-utilization)\n";
    } else {
      s += "KV budget per GPU: " + gib(static_cast<double>(m.kv_budget_bytes)) + " -> " +
           std::to_string(m.kv_tokens_per_rank) + " tokens per GPU's cache, " + std::to_string(m.kv_tokens_total) +
           " tokens in all (each DP group caches its own requests)\n";
    }
  }
  const LinkBytes& l = m.links;
  s += "link bytes sent per GPU per decode token (ring):\n";
  s += "  tp all-reduces: " + std::to_string(l.tp_all_reduces) + " of " + kib(l.all_reduce_payload) + " (" +
       kib(l.tp_all_reduces ? l.tp_all_reduce_bytes / l.tp_all_reduces : 0) + " sent each) = " + kib(l.tp_all_reduce_bytes) + "\n";
  s += "  DP-attention MoE exchange: " + kib(l.moe_exchange_bytes) + "\n";
  s += "  logits all-gather (f32): " + kib(l.logits_bytes) + "\n";
  s += "  total as built: " + kib(l.total_as_built()) + "\n";
  if (l.all_to_all_bytes > 0) s += "  EP all-to-all dispatch + combine (alternative, not built): " + kib(l.all_to_all_bytes) + "\n";
  for (const std::string& n : m.notes) s += "note: " + n + "\n";
  return s;
}

std::string memory_plan_json(const MemoryPlan& m) {
  nlohmann::ordered_json j;
  j["layout"] = m.layout;
  j["world"] = m.world;
  j["weight_bytes_per_gpu"] = m.weight_bytes_max;
  j["weight_bytes_per_gpu_min"] = m.weight_bytes_min;
  j["weight_bytes_total"] = m.weight_bytes_total;
  j["kv_bytes_per_token_per_gpu"] = m.kv_bytes_per_token;
  j["fits"] = m.fits;
  j["kv_budget_bytes_per_gpu"] = m.kv_budget_bytes;
  j["kv_tokens_per_gpu"] = m.kv_tokens_per_rank;
  j["kv_tokens_total"] = m.kv_tokens_total;
  j["tp_all_reduces_per_token"] = m.links.tp_all_reduces;
  j["tp_all_reduce_bytes_per_token"] = m.links.tp_all_reduce_bytes;
  j["moe_exchange_bytes_per_token"] = m.links.moe_exchange_bytes;
  j["logits_bytes_per_token"] = m.links.logits_bytes;
  j["link_bytes_per_token_as_built"] = m.links.total_as_built();
  j["all_to_all_bytes_per_token"] = m.links.all_to_all_bytes;
  j["notes"] = m.notes;
  return j.dump();
}

}  // namespace mxserve::cli
