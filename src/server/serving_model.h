// ServingModel: everything `mxserve serve` loads behind the HTTP front end -- backend, model weights (a
// checkpoint, or synthetic weights from a config.json), tokenizer + chat template, the KV pool sized
// from a memory budget, and the running engine. Logs the start-up summary (config, memory plan: weights,
// KV blocks, token capacity, maximum concurrency). Owns the objects; the server borrows them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "server/server_context.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::server {

struct ServingConfig {
  std::string model_path;          // checkpoint dir, or a config.json (file or dir) with synthetic weights
  bool synthetic_weights = false;
  int64_t num_layers = 0;          // > 0: override num_hidden_layers (synthetic weights only)
  uint64_t seed = 0;               // synthetic weights
  std::string synthetic_quantization;  // synthetic routed experts: "", "mxfp4", "fp8-block"
  std::string tokenizer_dir;       // default: the model directory
  std::string backend = "cpu";
  std::string moe_tuning_dir;      // --moe-tuning-dir: MoE kernel tables added to / overriding the embedded ones
  int64_t max_model_len = 0;       // 0: max_position_embeddings, capped by the KV capacity
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 2048;
  int64_t chunked_prefill_size = 2048;
  int64_t max_num_seqs = 256;
  uint64_t kv_cache_bytes = uint64_t{1} << 30;
  int64_t num_kv_blocks = 0;       // > 0: overrides kv_cache_bytes
  bool enable_prefix_cache = true;
  int64_t max_queued_requests = 1024;
  runtime::SpecConfig spec;        // MTP speculative decoding (num_steps 0 = off)
};

class ServingModel {
 public:
  static Result<std::unique_ptr<ServingModel>> load(const ServingConfig& config);
  ~ServingModel();

  ModelServices services();
  runtime::Engine& engine() { return *engine_; }

 private:
  ServingModel() = default;

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<model::CausalLM> model_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::optional<tokenizer::ChatTemplate> chat_template_;
  std::unique_ptr<runtime::Engine> engine_;
  std::shared_ptr<structured::StructuredOutputs> structured_;
  int64_t max_model_len_ = 0;
};

// "1GiB", "512MiB", "2G", "1000000" -> bytes.
Result<uint64_t> parse_byte_size(const std::string& text);
// Parameter count implied by a config (weights estimate for the start-up memory plan).
int64_t estimate_parameters(const model::ModelConfig& c, bool include_mtp);

}  // namespace mxserve::server
