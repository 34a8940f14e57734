// ServerContext: what every handler shares -- options, metrics, and (once the model is loaded) the
// engine, tokenizer and chat template. The model half is published once, through set_ready(); before
// that /health is 503 and generation endpoints answer 503 "loading".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kernels/moe_tuning.h"
#include "runtime/engine.h"
#include "server/metrics.h"
#include "structured/grammar_constraint.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                      // 0: an ephemeral port (tests)
  std::string served_model_name = "mxserve";
  std::string model_root;               // reported as "root" by /v1/models
  std::string api_key;                  // empty: no authentication
  size_t max_body_bytes = 8u << 20;     // larger bodies are a 413
  int max_json_depth = 64;
  int max_http_threads = 2048;          // one per open connection (streams hold theirs until done)
  double stats_interval_s = 10;         // periodic stats log line; 0 = off
};

struct ModelServices {
  runtime::Engine* engine = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  std::optional<tokenizer::ChatTemplate> chat_template;  // absent: /v1/chat/completions is a 400
  int64_t max_model_len = 0;
  std::shared_ptr<structured::StructuredOutputs> structured;  // makes the per-choice grammar constraints
  // The backend's MoE kernel choices (mxserve:moe_kernel_config); absent or empty without tuned selection.
  std::function<std::vector<kernels::MoeKernelConfigRow>()> moe_kernel_configs;
};

struct ServerContext {
  explicit ServerContext(ServerOptions o) : options(std::move(o)), metrics(options.served_model_name) {}

  ServerOptions options;
  Metrics metrics;
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  std::atomic<bool> stopping{false};    // set after the drain timeout: sessions abort what still runs
  std::atomic<int> active_sessions{0};  // GenerationSessions alive (streams outlive their handler call)
  ModelServices model;  // valid once ready
  const int64_t created_unix = static_cast<int64_t>(std::time(nullptr));
};

}  // namespace mxserve::server
