#include "server/http_server.h"

#include <algorithm>

#include "core/logging.h"
#include "server/anthropic_handler.h"
#include "server/api_key.h"
#include "server/completion_handlers.h"
#include "server/info_routes.h"
#include "server/json_util.h"
#include "server/log_text.h"
#include "server/stats_line.h"
#include "server/tokenize_routes.h"

namespace mxserve::server {
HttpServer::HttpServer(ServerOptions options)
    : ctx_(std::make_unique<ServerContext>(std::move(options))),
      loop_(std::make_unique<http::EventLoop>(ctx_->options.http, static_cast<http::Service&>(*this))),
      cors_(ctx_->options.allowed_origins) {}

HttpServer::~HttpServer() { stop(); }

HttpServer::Route HttpServer::route_of(const http::Request& req) {
  const std::string& p = req.path;
  if (req.method == "POST") {
    if (p == "/v1/chat/completions") return Route::kChat;
    if (p == "/v1/completions") return Route::kCompletions;
    if (p == "/v1/messages") return Route::kMessages;
    if (p == "/v1/messages/count_tokens") return Route::kCountTokens;
    if (p == "/tokenize") return Route::kTokenize;
    if (p == "/detokenize") return Route::kDetokenize;
  } else if (req.method == "GET") {
    if (p == "/health") return Route::kHealth;
    if (p == "/metrics") return Route::kMetrics;
    if (p == "/v1/models") return Route::kModels;
    if (p.rfind("/v1/models/", 0) == 0 && p.size() > 11) return Route::kModelById;
    if (p == "/version") return Route::kVersion;
  }
  return Route::kNone;
}

std::optional<http::Response> HttpServer::admit(const http::Request& head) {
  if (auto pre = cors_.preflight(head)) return pre;  // OPTIONS from an allowed origin: before the API key
  http::Response res;
  cors_.add_headers(head, res);
  const ServerContext& ctx = *ctx_;
  const bool anthropic = route_of(head) == Route::kMessages || route_of(head) == Route::kCountTokens;
  if (head.path.rfind("/v1/", 0) == 0 && !ctx.options.api_key.empty() &&
      !bearer_token_matches(head.raw_header("authorization"), ctx.options.api_key) &&
      !(anthropic && x_api_key_matches(head.raw_header("x-api-key"), ctx.options.api_key))) {
    if (anthropic) write_anthropic_error(anthropic_unauthorized(), res);
    else write_error(*ctx_, unauthorized(), res);
    return res;
  }
  if (route_of(head) == Route::kNone) {
    write_error(*ctx_, route_not_found(head.method, head.path.substr(0, 256)), res);
    return res;
  }
  return std::nullopt;
}

bool HttpServer::runs_inline(const http::Request& req) const {
  const Route r = route_of(req);
  return r != Route::kChat && r != Route::kCompletions && r != Route::kMessages && r != Route::kCountTokens &&
         r != Route::kTokenize && r != Route::kDetokenize;
}

void HttpServer::handle(const http::Request& req, http::Response& res) {
  ServerContext& ctx = *ctx_;
  cors_.add_headers(req, res);
  switch (route_of(req)) {
    case Route::kChat:
    case Route::kCompletions:
    case Route::kMessages:
    case Route::kCountTokens: {
      ++in_flight_;
      struct Done {
        std::atomic<int>& n;
        ~Done() { --n; }
      } done{in_flight_};
      // The one place generation responses get common headers: benchmark-mode output is marked as such.
      if (ctx.ready && ctx.model.simulated_acceptance > 0) res.set_header("x-mxserve-simulated-acceptance", "true");
      if (route_of(req) == Route::kChat) handle_chat_completions(ctx, req, res);
      else if (route_of(req) == Route::kMessages) handle_messages(ctx, req, res);
      else if (route_of(req) == Route::kCountTokens) handle_count_tokens(ctx, req, res);
      else handle_completions(ctx, req, res);
      return;
    }
    case Route::kModels: return handle_models(ctx, res);
    case Route::kModelById: return handle_model_by_id(ctx, req.path, res);
    case Route::kVersion: return handle_version(ctx, res);
    case Route::kTokenize: return handle_tokenize(ctx, req, res);
    case Route::kDetokenize: return handle_detokenize(ctx, req, res);
    case Route::kHealth:
      if (ctx.ready && !ctx.draining) {
        res.status = 200;
        res.set_content("{\"status\":\"ok\"}", "application/json");
      } else {
        res.status = 503;
        res.set_content(ctx.draining ? "{\"status\":\"shutting down\"}" : "{\"status\":\"loading\"}", "application/json");
      }
      return;
    case Route::kMetrics: {
      std::optional<runtime::EngineStats> stats;
      std::vector<launch::MoeKernelConfigRow> moe;
      if (ctx.ready) {
        stats = ctx.model.engine->stats();
        if (ctx.model.moe_kernel_configs) moe = ctx.model.moe_kernel_configs();
        check_spec_alarm(*stats);
      }
      const SpecAlarmState alarm = ctx.spec_alarm.state();
      return res.set_content(ctx.metrics.render(stats, moe, ctx.ready ? ctx.model.simulated_acceptance : 0.0, &alarm),
                             "text/plain; version=0.0.4; charset=utf-8");
    }
    case Route::kNone: return write_error(ctx, route_not_found(req.method, req.path), res);
  }
}

http::Response HttpServer::error(int status, const std::string& message) {
  ApiError e;
  if (status == 503) {
    e = overloaded(message);
  } else if (status == 500) {
    MX_LOG(kError) << "handler exception: " << sanitize_for_log(message, 512);
    e = internal(message);
  } else {
    e.http_status = status;
    e.message = message;
    e.type = status >= 500 ? "server_error" : "invalid_request_error";
    if (status == 413) e.code = "request_too_large";
  }
  http::Response res;
  write_error(*ctx_, e, res);
  return res;
}

void HttpServer::on_response(int status) { ctx_->metrics.http_response(status); }

Status HttpServer::bind() { return loop_->listen(ctx_->options.host, ctx_->options.port); }

void HttpServer::start() {
  loop_->start();
  if (ctx_->options.stats_interval_s > 0 || ctx_->spec_alarm.state().enabled)
    stats_thread_ = std::thread([this] { stats_loop(); });
}

void HttpServer::set_ready(ModelServices model) {
  ctx_->model = std::move(model);
  ctx_->ready = true;
}

void HttpServer::begin_drain() { ctx_->draining = true; }

void HttpServer::wait_idle(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while ((in_flight_ > 0 || ctx_->active_sessions > 0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void HttpServer::stop() {
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  stats_cv_.notify_all();
  ctx_->draining = true;
  ctx_->stopping = true;
  loop_->stop();
  if (stats_thread_.joinable()) stats_thread_.join();
}

void HttpServer::check_spec_alarm(const runtime::EngineStats& stats) {
  if (auto line = ctx_->spec_alarm.update(stats.spec)) {
    if (ctx_->spec_alarm.state().collapsed) MX_LOG(kWarn) << *line;
    else MX_LOG(kInfo) << *line;
  }
}

// Wakes every second: the acceptance alarm is checked each time, the stats line every --stats-interval.
void HttpServer::stats_loop() {
  StatsLine line;
  std::unique_lock<std::mutex> lock(stats_mutex_);
  const double interval = ctx_->options.stats_interval_s;
  const auto tick = std::chrono::duration<double>(interval > 0 ? std::min(interval, 1.0) : 1.0);
  auto next_line = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(interval));
  while (!stats_cv_.wait_for(lock, tick, [this] { return stopping_; })) {
    if (!ctx_->ready) continue;
    const runtime::EngineStats stats = ctx_->model.engine->stats();
    check_spec_alarm(stats);
    if (interval <= 0 || std::chrono::steady_clock::now() < next_line) continue;
    next_line += std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(interval));
    if (auto text = line.update(stats, ctx_->metrics)) {
      MX_LOG(kInfo) << *text;
    }
  }
}

}  // namespace mxserve::server
