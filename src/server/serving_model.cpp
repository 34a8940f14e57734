#include "server/serving_model.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/logging.h"
#include "io/checkpoint.h"
#include "kernels/moe_tuning.h"
#include "runtime/executor.h"
#include "runtime/spec/self_test.h"

#if __has_include("model/synthetic_weights.h")
#define MXSERVE_HAVE_SYNTHETIC 1
#endif

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
  return static_cast<uint64_t>(v * mult);
}

int64_t estimate_parameters(const model::ModelConfig& c, bool include_mtp) {
  const int64_t H = c.d_model, V = c.vocab_size;
  const int64_t attn = H * c.n_heads * c.head_dim * 2 + H * c.n_kv_heads * c.head_dim * 2;
  const int64_t dense = 3 * H * c.dense_inter;
  const int64_t moe = c.n_experts * 3 * H * c.moe_inter + 3 * H * c.shared_inter() + c.n_experts * H;
  int64_t total = V * H * (c.tie_word_embeddings ? 1 : 2);
  for (int64_t l = 0; l < c.n_layers + (include_mtp ? c.n_mtp_layers : 0); ++l) total += attn + (c.is_moe_layer(l) ? moe : dense);
  return total;
}

ServingModel::~ServingModel() {
  if (engine_) engine_->stop();
}

Result<std::unique_ptr<ServingModel>> ServingModel::load(const ServingConfig& cfg) {
  std::unique_ptr<ServingModel> sm(new ServingModel());
  const std::string model_dir = dir_of(cfg.model_path);
  const std::string tok_dir = cfg.tokenizer_dir.empty() ? model_dir : cfg.tokenizer_dir;
  auto tok = tokenizer::Tokenizer::load_dir(tok_dir);
  if (!tok.is_ok()) return tok.status().with_context("loading the tokenizer from " + tok_dir + " (--tokenizer)");
  sm->tokenizer_ = std::move(*tok);
  if (!sm->tokenizer_->chat_template().empty()) {
    auto tmpl = tokenizer::ChatTemplate::parse(sm->tokenizer_->chat_template());
    if (tmpl.is_ok()) sm->chat_template_ = std::move(*tmpl);
    else MX_LOG(kWarn) << "chat template unusable, /v1/chat/completions disabled: " << tmpl.status().to_string();
  } else {
    MX_LOG(kWarn) << "no chat template in " << tok_dir << ": /v1/chat/completions is disabled";
  }

  if (!cfg.moe_tuning_dir.empty())  // before the backend: it validates every table's variant names
    MX_RETURN_IF_ERROR(kernels::add_global_moe_tuning_dir(cfg.moe_tuning_dir));
  MX_ASSIGN_OR_RETURN(sm->backend_, backend::make_backend(cfg.backend));
  model::LoadOptions lo;
  lo.load_mtp = cfg.spec.num_steps > 0;  // the MTP layer is loaded only to draft with it
  if (cfg.synthetic_weights) {
#ifdef MXSERVE_HAVE_SYNTHETIC
    lo.synthetic = true;
    lo.seed = cfg.seed;
    lo.num_layers_override = cfg.num_layers;
    lo.synthetic_quantization = cfg.synthetic_quantization;
#else
    return unsupported("--synthetic-weights: this build has no synthetic weight generator yet");
#endif
  }
  MX_LOG(kInfo) << "loading " << (cfg.synthetic_weights ? "synthetic weights for " : "weights from ") << cfg.model_path
                << " on " << sm->backend_->name() << " ...";
  const auto t0 = std::chrono::steady_clock::now();
  // NOTE: the loader has no progress callback yet; a ticker line every 5 s shows it is alive.
  std::mutex tick_mutex;
  std::condition_variable tick_cv;
  bool loaded = false;
  std::thread ticker([&] {
    std::unique_lock<std::mutex> lock(tick_mutex);
    for (int s = 5; !tick_cv.wait_for(lock, std::chrono::seconds(5), [&] { return loaded; }); s += 5)
      MX_LOG(kInfo) << "still loading weights (" << s << " s)";
  });
  auto model = model::load_causal_lm(cfg.model_path, *sm->backend_, lo);
  {
    std::lock_guard<std::mutex> lock(tick_mutex);
    loaded = true;
  }
  tick_cv.notify_all();
  ticker.join();
  if (!model.is_ok()) return model.status().with_context("loading the model " + cfg.model_path);
  sm->model_ = std::move(*model);
  if (cfg.spec.num_steps > 0 && !sm->model_->has_mtp())
    return invalid_argument("--speculative-algorithm mtp: the model has no MTP layer (num_nextn_predict_layers)");
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const model::ModelConfig& mc = sm->model_->config();
  const int64_t params = estimate_parameters(mc, lo.load_mtp);
  MX_LOG(kInfo) << "model: " << model::describe_config(mc);
  MX_LOG(kInfo) << "weights: ~" << params / 1000000.0 << " M parameters, ~"
                << human_bytes(static_cast<double>(params) * dtype_bits(sm->backend_->weight_dtype()) / 8.0) << " as "
                << dtype_name(sm->backend_->weight_dtype()) << ", loaded in " << load_s << " s";
  if (sm->tokenizer_->vocab_size() > mc.vocab_size && cfg.synthetic_weights) {
    MX_LOG(kWarn) << "the tokenizer has " << sm->tokenizer_->vocab_size() << " tokens, the model's vocabulary "
                  << mc.vocab_size << ": prompts with larger ids are rejected per request (synthetic weights: allowed)";
  } else if (sm->tokenizer_->vocab_size() > mc.vocab_size) {
    return invalid_argument("the tokenizer has " + std::to_string(sm->tokenizer_->vocab_size()) +
                            " tokens but the model's vocabulary is " + std::to_string(mc.vocab_size) +
                            ": wrong --tokenizer for this model?");
  }

  // KV pool.
  const uint64_t per_block = sm->model_->kv_spec(1, cfg.block_size).bytes();
  int64_t n_blocks = cfg.num_kv_blocks > 0 ? cfg.num_kv_blocks
                                           : runtime::kv_blocks_for_bytes(*sm->model_, cfg.block_size, cfg.kv_cache_bytes);
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
                << human_bytes(static_cast<double>(per_block) / cfg.block_size) << "/token); maximum concurrency for "
                << max_len << " tokens per request: " << static_cast<double>(capacity) / max_len << "x";

  runtime::EngineConfig ec;
  ec.scheduler.block_size = cfg.block_size;
  ec.scheduler.max_num_batched_tokens = cfg.max_num_batched_tokens;
  ec.scheduler.chunked_prefill_size = std::min(cfg.chunked_prefill_size, cfg.max_num_batched_tokens);
  ec.scheduler.max_running = cfg.max_num_seqs;
  ec.scheduler.enable_prefix_cache = cfg.enable_prefix_cache;
  ec.n_blocks = n_blocks;
  ec.max_model_len = max_len;
  ec.max_waiting = cfg.max_queued_requests;
  ec.eos_token_ids = eos_ids(mc, model_dir, *sm->tokenizer_);
  ec.spec = cfg.spec;
  MX_LOG(kInfo) << "scheduler: max_model_len=" << max_len << " max_num_seqs=" << cfg.max_num_seqs
                << " max_num_batched_tokens=" << cfg.max_num_batched_tokens
                << " chunked_prefill_size=" << ec.scheduler.chunked_prefill_size
                << " prefix_cache=" << (cfg.enable_prefix_cache ? "on" : "off")
                << " max_queued_requests=" << cfg.max_queued_requests << " eos_ids=" << ec.eos_token_ids.size()
                << " speculative=" << (cfg.spec.num_steps > 0 ? "mtp x" + std::to_string(cfg.spec.num_steps) : "off");
  // Before the main KV pool exists, so the self-test's small private pool fits next to the weights.
  MX_RETURN_IF_ERROR(runtime::spec_self_test_after_load(*sm->model_, *sm->backend_, cfg.spec, cfg.block_size));
  sm->structured_ = std::make_shared<structured::StructuredOutputs>(*sm->tokenizer_, mc.vocab_size);
  sm->structured_->index();  // built now (logged), not in the first structured request
  auto executor = runtime::make_model_executor(*sm->model_, *sm->backend_, n_blocks, cfg.block_size);
  sm->engine_ = std::make_unique<runtime::Engine>(ec, std::move(executor));
  sm->engine_->start();
  return sm;
}

ModelServices ServingModel::services() {
  ModelServices s;
  s.engine = engine_.get();
  s.tokenizer = tokenizer_.get();
  s.chat_template = chat_template_;
  s.max_model_len = max_model_len_;
  s.structured = structured_;
  backend::Backend* be = backend_.get();
  s.moe_kernel_configs = [be] { return be->moe_kernel_configs(); };
  return s;
}

}  // namespace mxserve::server
