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
#include <vector>

#include "chat/output_parser.h"
#include "launch/moe_kernel_report.h"
#include "runtime/engine.h"
#include "server/http/limits.h"
#include "server/metrics.h"
#include "server/spec_alarm.h"
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
  http::HttpLimits http;                // connections, heads, bodies, timeouts, handler threads (413, 431, ...)
  int max_json_depth = 64;
  int max_logprobs = 20;                // top_logprobs (chat) / logprobs (completions) above this: 400 (vLLM's flag)
  int64_t max_logprob_entries = 1 << 18;  // non-streaming: n x max_tokens x (top_logprobs + 1) above this: 400
  double stats_interval_s = 10;         // periodic stats log line; 0 = off
  std::vector<std::string> allowed_origins;  // CORS (--allowed-origins): empty = off; "*" = any origin
  SpecAlarmOptions spec_alarm;          // MTP acceptance collapse alarm (--spec-acceptance-alarm / -window)
  std::string version = "0.1.0";        // GET /version
  std::string commit;                   // GET /version (empty: not reported)
};

struct ModelServices {
  runtime::Engine* engine = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  std::optional<tokenizer::ChatTemplate> chat_template;  // absent: /v1/chat/completions is a 400
  chat::OutputFormats output_formats;   // reasoning / tool-call parsers of chat responses (none: plain content)
  int64_t max_model_len = 0;
  // > 0: benchmark mode, drafts accepted at this simulated mean length (outputs are meaningless); the server
  // marks generation responses (x-mxserve-simulated-acceptance) and /metrics (mxserve:spec_decode_simulated_acceptance).
  double simulated_acceptance = 0;
  std::shared_ptr<structured::StructuredOutputs> structured;  // makes the per-choice grammar constraints
  // The backend's MoE kernel choices (mxserve:moe_kernel_config); absent or empty without tuned selection.
  std::function<std::vector<launch::MoeKernelConfigRow>()> moe_kernel_configs;
};

struct ServerContext {
  explicit ServerContext(ServerOptions o)
      : options(std::move(o)), metrics(options.served_model_name), spec_alarm(options.spec_alarm) {}

  ServerOptions options;
  Metrics metrics;
  SpecAcceptanceAlarm spec_alarm;
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  std::atomic<bool> stopping{false};    // set after the drain timeout: sessions abort what still runs
  std::atomic<int> active_sessions{0};  // GenerationSessions alive (streams outlive their handler call)
  ModelServices model;  // valid once ready
  const int64_t created_unix = static_cast<int64_t>(std::time(nullptr));
};

}  // namespace mxserve::server
