#include "server/serving_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/logging.h"
#include "eval/moe_activation_gate.h"
#include "io/checkpoint.h"
#include "launch/launch_memory.h"
#include "model/weight_stats.h"
#include "runtime/kv_tier_self_test.h"
#include "server/chat_output.h"

namespace mxserve::server {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, units[u]);
  return buf;
}

std::string dir_of(const std::string& path) {
  if (io::is_directory(path)) return path;
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// EOS ids: the model config's, generation_config.json's, and the tokenizer's eos_token.
std::vector<int64_t> eos_ids(const model::ModelConfig& cfg, const std::string& model_dir, const tokenizer::Tokenizer& tok) {
  std::set<int64_t> ids(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  std::ifstream gen(model_dir + "/generation_config.json");
  if (gen) {
    auto j = nlohmann::json::parse(gen, nullptr, false);
    if (j.is_object() && j.contains("eos_token_id")) {
      const auto& e = j["eos_token_id"];
      if (e.is_number_integer()) ids.insert(e.get<int64_t>());
      if (e.is_array())
        for (const auto& x : e)
          if (x.is_number_integer()) ids.insert(x.get<int64_t>());
    }
  }
  if (tok.eos_token())
    if (auto id = tok.token_to_id(*tok.eos_token())) ids.insert(*id);
  return {ids.begin(), ids.end()};
}

}  // namespace

Result<uint64_t> parse_byte_size(const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (...) {
    return invalid_argument("'" + text + "' is not a size (e.g. 4GiB, 512MiB, 1000000)");
  }
  std::string unit = text.substr(pos);
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else return invalid_argument("'" + text + "': unknown size unit '" + unit + "' (B, KiB, MiB, GiB, KB, MB, GB)");
  if (!std::isfinite(v) || v <= 0) return invalid_argument("'" + text + "' must be a positive size");
  if (!std::isdigit(static_cast<unsigned char>(text[0])) && text[0] != '.')
    return invalid_argument("'" + text + "' is not a size (e.g. 4GiB, 512MiB, 1000000)");
  const double bytes = v * mult;  // a cast of a double at or past 2^63 is undefined: refuse it first
  if (bytes >= 9.2e18) return invalid_argument("'" + text + "' is too large a size");
  if (bytes < 1) return invalid_argument("'" + text + "' is less than one byte");
  return static_cast<uint64_t>(bytes);
}

namespace {
// The W4A8 accuracy gate (eval/moe_activation_gate.h) when FP8 MoE activations were asked for; like the
// speculative self-test it runs before the main KV pool exists, on a small private pool.
Status moe_activation_gate(launch::LaunchedModel& lm, const ServingConfig& cfg) {
  const launch::LaunchConfig lc = cfg.launch_config();
  if (!lc.backend_options.kernels.fp8_moe_activations()) return Status::ok();
  if (lm.world() > 1) {
    MX_LOG(kWarn) << "W4A8 accuracy gate skipped, FP8 MoE activations served UNCHECKED: the gate runs on one rank "
                  << "(this launch has " << lm.world() << "); measure it on one GPU with --num-layers and "
                  << "--synthetic-weights or a checkpoint, or serve with --moe-activation-dtype bf16";
    return Status::ok();
  }
  // The gate decides: beyond its bounds (or when the FP8 path did not run) the backend is set back to bf16
  // activations, and the warning says so.
  MX_ASSIGN_OR_RETURN(eval::MoeActivationGateDecision d,
                      eval::apply_moe_activation_gate(lm.model(), lm.backend(), lc.backend_options.kernels));
  if (d.warn) MX_LOG(kWarn) << d.message;
  else MX_LOG(kInfo) << d.message;
  return Status::ok();
}
}  // namespace

launch::LaunchConfig ServingConfig::launch_config() const {
  launch::LaunchConfig lc;
  lc.model.path = model_path;
  lc.model.synthetic = synthetic_weights;
  lc.model.seed = seed;
  lc.model.num_layers = num_layers;
  lc.model.synthetic_quantization = synthetic_quantization;
  lc.model.kv_cache_dtype = kv_cache_dtype;
  lc.model.require_mtp = spec.num_steps > 0;  // the MTP layer is loaded only to draft with it
  lc.backend = backend;
  lc.backend_options.kernels.moe_activation_dtype = moe_activation_dtype;
  lc.backend_options.kernels.cascade_attention = cascade_attention;
  lc.moe_tuning_dir = moe_tuning_dir;
  lc.parallel = parallel;
  lc.log_progress = true;
  return lc;
}

ServingModel::~ServingModel() {
  if (engine_) engine_->stop();
}

Result<std::unique_ptr<ServingModel>> ServingModel::load(const ServingConfig& cfg) {
  if (cfg.spec.simulate_acceptance && !cfg.benchmark_mode)
    return invalid_argument("--speculative-simulate-acceptance makes the output meaningless (drafts are accepted at a "
                            "simulated rate, not verified): it is a benchmark setting, allowed only with --benchmark-mode");
  std::unique_ptr<ServingModel> sm(new ServingModel());
  sm->simulated_acceptance_ = cfg.spec.simulate_acceptance.value_or(0.0);
  const std::string model_dir = dir_of(cfg.model_path);
  const std::string tok_dir = cfg.tokenizer_dir.empty() ? model_dir : cfg.tokenizer_dir;
  auto tok = tokenizer::Tokenizer::load_dir(tok_dir);
  if (!tok.is_ok())
    return tok.status().with_context(cfg.tokenizer_dir.empty()
                                         ? "loading the tokenizer from the model directory " + tok_dir +
                                               " (no --tokenizer given: pass --tokenizer DIR if it lives elsewhere)"
                                         : "loading the tokenizer from --tokenizer " + tok_dir);
  sm->tokenizer_ = std::move(*tok);
  if (!sm->tokenizer_->chat_template().empty()) {
    auto tmpl = tokenizer::ChatTemplate::parse(sm->tokenizer_->chat_template());
    if (tmpl.is_ok()) sm->chat_template_ = std::move(*tmpl);
    else MX_LOG(kWarn) << "chat template unusable, /v1/chat/completions disabled: " << tmpl.status().to_string();
  } else {
    MX_LOG(kWarn) << "no chat template in " << tok_dir << ": /v1/chat/completions is disabled";
  }
  MX_ASSIGN_OR_RETURN(sm->output_formats_, resolve_output_formats(cfg.tool_call_parser, cfg.reasoning_parser,
                                                                  sm->tokenizer_->chat_template()));

  MX_ASSIGN_OR_RETURN(sm->launched_, launch::launch_model(cfg.launch_config()));
  launch::LaunchedModel& lm = *sm->launched_;
  const model::ModelConfig& mc = lm.config();
  const model::WeightStats ws = model::weight_stats(lm.weight_table());
  MX_LOG(kInfo) << "model: " << model::describe_config(mc);
  MX_LOG(kInfo) << "weights: ~" << ws.parameters / 1000000.0 << " M parameters, ~"
                << human_bytes(static_cast<double>(ws.parameters) * dtype_bits(lm.weight_dtype()) / 8.0) << " as "
                << dtype_name(lm.weight_dtype()) << ", loaded in " << lm.load_seconds() << " s";
  if (sm->tokenizer_->vocab_size() > mc.vocab_size && cfg.synthetic_weights) {
    MX_LOG(kWarn) << "the tokenizer has " << sm->tokenizer_->vocab_size() << " tokens, the model's vocabulary "
                  << mc.vocab_size << ": prompts with larger ids are rejected per request (synthetic weights: allowed)";
  } else if (sm->tokenizer_->vocab_size() > mc.vocab_size) {
    return invalid_argument("the tokenizer has " + std::to_string(sm->tokenizer_->vocab_size()) +
                            " tokens but the model's vocabulary is " + std::to_string(mc.vocab_size) +
                            ": wrong --tokenizer for this model?");
  }

  // KV pool: on CUDA, what is left of each GPU after the weights and the largest step's measured peak
  // (launch/launch_memory.h; a dry run before the pool exists), split among the ranks sharing it.
  uint64_t kv_bytes = cfg.kv_cache_bytes;
  if (cfg.num_kv_blocks <= 0) {
    launch::KvBudgetRequest kr;
    kr.block_size = cfg.block_size;
    kr.max_num_batched_tokens = cfg.max_num_batched_tokens;
    kr.chunked_prefill_size = std::min(cfg.chunked_prefill_size, cfg.max_num_batched_tokens);
    kr.max_model_len = cfg.max_model_len > 0 ? cfg.max_model_len : mc.max_position_embeddings;
    kr.spec = cfg.spec;
    kr.max_num_seqs = cfg.max_num_seqs;
    kr.kv_bytes_per_rank = cfg.kv_cache_bytes;
    kr.kv_bytes_given = cfg.kv_cache_bytes_given;
    kr.gpu_memory_utilization = cfg.gpu_memory_utilization;
    kr.utilization_given = cfg.gpu_memory_utilization_given;
    MX_ASSIGN_OR_RETURN(launch::KvBudget budget, launch::plan_kv_budget(lm, kr));
    kv_bytes = budget.kv_bytes_per_rank;
    lm.set_activation_reserve(budget.peak_activation_per_rank);
  }
  const uint64_t per_block = lm.kv_bytes_per_block(cfg.block_size);
  int64_t n_blocks = cfg.num_kv_blocks > 0 ? cfg.num_kv_blocks : lm.kv_blocks_for_bytes(cfg.block_size, kv_bytes);
  if (n_blocks < 2) return invalid_argument("--kv-cache-memory holds fewer than 2 KV blocks; raise it");
  const int64_t capacity = n_blocks * cfg.block_size;
  int64_t max_len = cfg.max_model_len > 0 ? cfg.max_model_len : std::min(mc.max_position_embeddings, capacity);
  if (mc.max_position_embeddings > 0 && max_len > mc.max_position_embeddings)
    return invalid_argument("--max-model-len " + std::to_string(max_len) + " exceeds the model's max_position_embeddings (" +
                            std::to_string(mc.max_position_embeddings) + ")");
  if (max_len > capacity)
    return invalid_argument("--max-model-len " + std::to_string(max_len) + " exceeds the KV cache capacity (" +
                            std::to_string(capacity) + " tokens); raise --kv-cache-memory");
  sm->max_model_len_ = max_len;
  MX_LOG(kInfo) << "KV cache: " << n_blocks << " blocks x " << cfg.block_size << " tokens = " << capacity
                << " tokens, " << human_bytes(static_cast<double>(per_block) * n_blocks) << " ("
                << human_bytes(static_cast<double>(per_block) / cfg.block_size) << "/token, "
                << kvcache::kv_cache_dtype_name(lm.model().kv_cache_dtype()) << "); maximum concurrency for "
                << max_len << " tokens per request: " << static_cast<double>(capacity) / max_len << "x";
  if (lm.model().kv_cache_dtype() == kvcache::KvCacheDtype::kFp8E4M3) {
    const kvcache::KvCacheSpec spec = lm.model().kv_spec(1, cfg.block_size);
    uint64_t bf16_per_block = 0;  // the same layout with bf16 elements and no scales
    bool packed = false;          // glm_moe_dsa: packed FP8 rows (u8 bytes, kernels/mla_fp8.h), no value count
    for (const auto& layer : spec.layers)
      for (const auto& t : layer.tensors) {
        packed = packed || t.dtype == DType::kU8;
        bf16_per_block += 2ull * static_cast<uint64_t>(t.width * cfg.block_size);
      }
    if (packed)
      MX_LOG(kInfo) << "KV cache: fp8_e4m3 packed latent rows (e4m3 + one f32 scale per 128 values, rope in bf16) "
                       "and FP8 indexer keys (docs/kv-cache.md)";
    else
      MX_LOG(kInfo) << "KV cache: fp8_e4m3 codes + one f32 scale per (token, kv head): "
                    << static_cast<double>(bf16_per_block) / static_cast<double>(per_block)
                    << "x the blocks a bf16 cache gets from the same memory";
  }

  runtime::EngineConfig ec;
  ec.scheduler.block_size = cfg.block_size;
  ec.scheduler.max_num_batched_tokens = cfg.max_num_batched_tokens;
  ec.scheduler.chunked_prefill_size = std::min(cfg.chunked_prefill_size, cfg.max_num_batched_tokens);
  ec.scheduler.max_running = cfg.max_num_seqs;
  ec.scheduler.max_step_seconds = cfg.max_itl_seconds;
  ec.scheduler.min_prefill_chunk = std::min(cfg.min_prefill_chunk, ec.scheduler.chunked_prefill_size);
  ec.scheduler.enable_prefix_cache = cfg.enable_prefix_cache;
  ec.scheduler.ttft_target_seconds = cfg.slo_ttft_seconds;
  ec.scheduler.ttft_over_itl = cfg.slo_ttft_over_itl;
  ec.n_blocks = n_blocks;
  ec.max_model_len = max_len;
  ec.max_waiting = cfg.max_queued_requests;
  ec.max_logprobs = cfg.max_logprobs;
  ec.eos_token_ids = eos_ids(mc, model_dir, *sm->tokenizer_);
  ec.spec = cfg.spec;
  ec.cuda_graphs = cfg.cuda_graphs;
  ec.step_log = cfg.step_log;
  if (cfg.step_log) {
    MX_LOG(kInfo) << "step log: one JSON line per engine step to " << cfg.step_log->path()
                  << " (--step-log; fit it with `mxserve simulate --fit-step-log " << cfg.step_log->path() << "`)";
  }
  if (cfg.kv_cache_host_memory > 0) {  // the host KV tier (docs/kv-cache.md "Host-memory tier")
    if (!cfg.enable_prefix_cache)
      return invalid_argument("--kv-cache-host-memory needs the prefix cache: drop --disable-prefix-cache");
    if (cfg.parallel.tp * cfg.parallel.dp * cfg.parallel.ep != 1)
      return unsupported("--kv-cache-host-memory runs on one GPU for now (--tp-size / --dp-size / --ep-size 1)");
    if (cfg.kv_cache_host_memory < per_block)
      return invalid_argument("--kv-cache-host-memory " + human_bytes(static_cast<double>(cfg.kv_cache_host_memory)) +
                              " holds no KV block (" + human_bytes(static_cast<double>(per_block)) + " each)");
    ec.kv_cache_host_memory = cfg.kv_cache_host_memory;
    MX_LOG(kInfo) << "host KV tier: " << human_bytes(static_cast<double>(cfg.kv_cache_host_memory)) << " = "
                  << cfg.kv_cache_host_memory / per_block << " blocks ("
                  << static_cast<double>(cfg.kv_cache_host_memory / per_block) / static_cast<double>(n_blocks)
                  << "x the device pool)";
  }
  MX_LOG(kInfo) << "scheduler: max_model_len=" << max_len << " max_num_seqs=" << cfg.max_num_seqs
                << " max_num_batched_tokens=" << cfg.max_num_batched_tokens
                << " chunked_prefill_size=" << ec.scheduler.chunked_prefill_size << " max_itl_ms="
                << 1e3 * cfg.max_itl_seconds << " min_prefill_chunk=" << ec.scheduler.min_prefill_chunk
                << " prefix_cache=" << (cfg.enable_prefix_cache ? "on" : "off")
                << " max_queued_requests=" << cfg.max_queued_requests << " eos_ids=" << ec.eos_token_ids.size()
                << " speculative=" << (cfg.spec.num_steps > 0 ? "mtp x" + std::to_string(cfg.spec.num_steps) : "off");
  if (cfg.slo_ttft_seconds > 0)
    MX_LOG(kInfo) << "scheduler: TTFT target " << 1e3 * cfg.slo_ttft_seconds
                  << " ms (--slo-ttft-ms): prefills earliest deadline first (arrival + target, then fewest tokens "
                     "left); a prefill the step cost model predicts late goes after the others (FCFS) until it has "
                     "waited 2x the target; a near-deadline chunk may pass --chunked-prefill-size up to "
                     "--max-num-batched-tokens, "
                  << (cfg.slo_ttft_over_itl
                          ? "and a prefill that meets its deadline only past --max-itl-ms takes that step past it "
                            "(--slo-ttft-over-itl)"
                          : "always within --max-itl-ms")
                  << "; until the cost model is ready, deadline order only";
  else
    MX_LOG(kInfo) << "scheduler: no TTFT target (--slo-ttft-ms 0): prefills FCFS";
  // Before the main KV pool exists, so the self-test's small private pool fits next to the weights.
  MX_RETURN_IF_ERROR(lm.spec_self_test(cfg.spec, cfg.block_size));
  if (ec.kv_cache_host_memory > 0) {  // round trip through the host tier on a private pool, before the main one
    const int32_t steps = cfg.spec.num_steps > 0 && lm.model().has_mtp() ? std::min(cfg.spec.num_steps, 3) : 0;
    auto rep = runtime::run_kv_tier_self_test(lm.make_executor(64, cfg.block_size), cfg.block_size, steps);
    if (!rep.is_ok()) return rep.status().with_context("host KV tier self-test");
    if (!rep->identical)
      return internal_error(rep->summary() + ": refusing to serve with --kv-cache-host-memory (drop the flag)");
    MX_LOG(kInfo) << rep->summary();
  }
  MX_RETURN_IF_ERROR(moe_activation_gate(lm, cfg));
  sm->structured_ = std::make_shared<structured::StructuredOutputs>(*sm->tokenizer_, mc.vocab_size);
  sm->structured_->index();  // built now (logged), not in the first structured request
  sm->engine_ = lm.make_engine(ec);
  sm->engine_->start();
  return sm;
}

ModelServices ServingModel::services() {
  ModelServices s;
  s.engine = engine_.get();
  s.tokenizer = tokenizer_.get();
  s.chat_template = chat_template_;
  s.output_formats = output_formats_;
  s.max_model_len = max_model_len_;
  s.simulated_acceptance = simulated_acceptance_;
  s.structured = structured_;
  launch::LaunchedModel* lm = launched_.get();
  s.moe_kernel_configs = [lm] { return lm->moe_kernel_configs(); };
  return s;
}

}  // namespace mxserve::server
