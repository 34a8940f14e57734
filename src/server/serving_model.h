// ServingModel: everything `mxserve serve` loads behind the HTTP front end -- the launched model (backend,
// weights: a checkpoint, or synthetic weights from a config.json; built by launch/launch.h), tokenizer +
// chat template, the KV pool sized from a memory budget, and the running engine. Logs the start-up summary (config, memory plan: weights,
// KV blocks, token capacity, maximum concurrency). Owns the objects; the server borrows them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "launch/launch.h"
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
  parallel::ParallelConfig parallel;  // --tp-size / --dp-size / --ep-size (launch_model checks what runs)
  int64_t max_model_len = 0;       // 0: max_position_embeddings, capped by the KV capacity
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 2048;
  int64_t chunked_prefill_size = 2048;
  double max_itl_seconds = 0.05;   // --max-itl-ms / 1000: the ITL target of chunked prefill (0 = caps only)
  int64_t min_prefill_chunk = 256; // --min-prefill-chunk
  double slo_ttft_seconds = 0;     // --slo-ttft-ms / 1000: TTFT target of the prefill order (0 = off, FCFS)
  bool slo_ttft_over_itl = false;  // --slo-ttft-over-itl: a chunk that alone meets its deadline may pass --max-itl-ms
  int64_t max_num_seqs = 256;
  uint64_t kv_cache_bytes = uint64_t{1} << 30;
  int64_t num_kv_blocks = 0;       // > 0: overrides kv_cache_bytes
  bool kv_cache_bytes_given = false;  // --kv-cache-memory named (CUDA: checked against the device, never resized)
  double gpu_memory_utilization = 0.9;  // CUDA: the share of each GPU for weights + forward peak + KV
  bool gpu_memory_utilization_given = false;  // the KV pool is sized from it: named, or serve on CUDA without --kv-cache-memory (cli/kv_pool_flags.h)
  kvcache::KvCacheDtype kv_cache_dtype = kvcache::KvCacheDtype::kAuto;  // --kv-cache-dtype
  uint64_t kv_cache_host_memory = 0;  // --kv-cache-host-memory: host KV tier bytes (0 = off; kvcache/host_tier.h)
  std::shared_ptr<runtime::StepLogWriter> step_log;  // --step-log FILE, opened by the CLI (null = off)
  std::string moe_activation_dtype;  // --moe-activation-dtype: "" / "bf16", or "fp8_e4m3" (W4A8, gated at start-up)
  bool cascade_attention = true;     // shared-prefix decode attention where it pays (CUDA; --disable-cascade-attention)
  bool enable_prefix_cache = true;
  bool cuda_graphs = false;  // replay CUDA graphs for plain decode steps (on by default on CUDA; --disable-cuda-graph / --enforce-eager)
  int64_t max_queued_requests = 1024;
  int32_t max_logprobs = 20;  // the engine's bound on top logprobs per token (--max-logprobs)
  runtime::SpecConfig spec;        // MTP speculative decoding (num_steps 0 = off)

  // The model half of this config, for the composition root.
  launch::LaunchConfig launch_config() const;
  std::string tool_call_parser;    // --tool-call-parser glm45|glm47|none; "" = detect from the chat template
  std::string reasoning_parser;    // --reasoning-parser glm45|none; "" = detect
  // Benchmark mode: the only mode in which spec.simulate_acceptance is allowed. Simulated acceptance makes the
  // output meaningless (drafts are accepted by a coin, not by the target model), so load() refuses it
  // otherwise, and the server marks every generation response and /metrics while it is on.
  bool benchmark_mode = false;
};

class ServingModel {
 public:
  static Result<std::unique_ptr<ServingModel>> load(const ServingConfig& config);
  ~ServingModel();

  ModelServices services();
  runtime::Engine& engine() { return *engine_; }

 private:
  ServingModel() = default;

  std::unique_ptr<launch::LaunchedModel> launched_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::optional<tokenizer::ChatTemplate> chat_template_;
  chat::OutputFormats output_formats_;
  std::unique_ptr<runtime::Engine> engine_;
  std::shared_ptr<structured::StructuredOutputs> structured_;
  int64_t max_model_len_ = 0;
  double simulated_acceptance_ = 0;  // > 0: benchmark mode with simulated acceptance (ModelServices)
};

// "1GiB", "512MiB", "2G", "1000000" -> bytes.
Result<uint64_t> parse_byte_size(const std::string& text);

}  // namespace mxserve::server
