#include "server/http_server.h"

#include <sys/socket.h>

#include <cstdio>

#include <httplib.h>

#include "core/logging.h"
#include "server/completion_handlers.h"
#include "server/elastic_pool.h"
#include "server/json_util.h"
#include "server/stats_line.h"

namespace mxserve::server {
namespace {

constexpr int kListenBacklog = 4096;

bool authorized(const ServerContext& ctx, const httplib::Request& req) {
  if (ctx.options.api_key.empty()) return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string expected = "Bearer " + ctx.options.api_key;
  if (h.size() != expected.size()) return false;
  unsigned char diff = 0;  // constant time in the key
  for (size_t i = 0; i < h.size(); ++i) diff |= static_cast<unsigned char>(h[i] ^ expected[i]);
  return diff == 0;
}

std::string models_json(const ServerContext& ctx) {
  nlohmann::ordered_json m;
  m["id"] = ctx.options.served_model_name;
  m["object"] = "model";
  m["created"] = ctx.created_unix;
  m["owned_by"] = "mxserve";
  m["root"] = ctx.options.model_root.empty() ? ctx.options.served_model_name : ctx.options.model_root;
  m["parent"] = nullptr;
  m["max_model_len"] = ctx.ready ? ctx.model.max_model_len : 0;
  m["permission"] = nlohmann::ordered_json::array();
  nlohmann::ordered_json j;
  j["object"] = "list";
  j["data"] = nlohmann::ordered_json::array({m});
  return dump_json(j);
}

}  // namespace

HttpServer::HttpServer(ServerOptions options)
    : ctx_(std::make_unique<ServerContext>(std::move(options))), http_(std::make_unique<httplib::Server>()) {
  install_routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::install_routes() {
  ServerContext& ctx = *ctx_;
  httplib::Server& s = *http_;
  const size_t max_threads = static_cast<size_t>(std::max(ctx.options.max_http_threads, 4));
  s.new_task_queue = [max_threads] { return new ElasticPool(max_threads); };
  s.set_payload_max_length(ctx.options.max_body_bytes);
  s.set_read_timeout(30, 0);
  s.set_write_timeout(30, 0);
  s.set_keep_alive_max_count(1000);
  s.set_tcp_nodelay(true);
  // SO_REUSEADDR only: SO_REUSEPORT (the library default) would let a second server bind our port.
  s.set_socket_options([this](socket_t fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = fd;
  });

  // Authentication for /v1/*; counts every response. Pre-routing runs before the body is read.
  s.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 && !authorized(ctx, req)) {
      write_error(ctx, unauthorized(), res);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_logger([&ctx](const httplib::Request&, const httplib::Response& res) { ctx.metrics.http_response(res.status); });
  s.set_error_handler(httplib::Server::HandlerWithResponse([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    if (res.status == 404) e = route_not_found(req.method, req.path);
    else if (res.status == 413) e = payload_too_large(ctx.options.max_body_bytes);
    else if (res.status == 400) e = bad_request("malformed HTTP request");
    else {
      e.http_status = res.status;
      e.message = "HTTP error " + std::to_string(res.status);
      e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    }
    const int status = res.status;
    write_error(ctx, e, res);
    res.status = status;
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([&ctx](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    MX_LOG(kError) << "handler exception: " << what;
    write_error(ctx, internal(what), res);
  });

  auto generation = [this](void (*fn)(ServerContext&, const httplib::Request&, httplib::Response&)) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      ++in_flight_;
      struct Done {
        std::atomic<int>& n;
        ~Done() { --n; }
      } done{in_flight_};
      // The one place generation responses get common headers: benchmark-mode output is marked as such.
      if (ctx_->ready && ctx_->model.simulated_acceptance > 0) res.set_header("x-mxserve-simulated-acceptance", "true");
      fn(*ctx_, req, res);
    };
  };
  s.Post("/v1/chat/completions", generation(&handle_chat_completions));
  s.Post("/v1/completions", generation(&handle_completions));
  s.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(models_json(ctx), "application/json");
  });
  s.Get("/health", [&ctx](const httplib::Request&, httplib::Response& res) {
    if (ctx.ready && !ctx.draining) {
      res.status = 200;
      res.set_content("{\"status\":\"ok\"}", "application/json");
    } else {
      res.status = 503;
      res.set_content(ctx.draining ? "{\"status\":\"shutting down\"}" : "{\"status\":\"loading\"}", "application/json");
    }
  });
  s.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    std::optional<runtime::EngineStats> stats;
    std::vector<kernels::MoeKernelConfigRow> moe;
    if (ctx.ready) {
      stats = ctx.model.engine->stats();
      if (ctx.model.moe_kernel_configs) moe = ctx.model.moe_kernel_configs();
    }
    res.set_content(ctx.metrics.render(stats, moe, ctx.ready ? ctx.model.simulated_acceptance : 0.0),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
}

Status HttpServer::bind() {
  const ServerOptions& o = ctx_->options;
  if (o.port == 0) {
    port_ = http_->bind_to_any_port(o.host);
    if (port_ <= 0) return unavailable("cannot bind an ephemeral port on " + o.host);
  } else {
    if (!http_->bind_to_port(o.host, o.port))
      return unavailable("cannot bind " + o.host + ":" + std::to_string(o.port) + " (in use, or a bad --host?)");
    port_ = o.port;
  }
  // The library listens with a backlog of 5; bursts of hundreds of connections need a deeper queue.
  if (listen_fd_ >= 0) ::listen(listen_fd_, kListenBacklog);
  return Status::ok();
}

void HttpServer::start() {
  listen_thread_ = std::thread([this] { http_->listen_after_bind(); });
  if (ctx_->options.stats_interval_s > 0) stats_thread_ = std::thread([this] { stats_loop(); });
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
  if (http_) http_->stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (stats_thread_.joinable()) stats_thread_.join();
}

void HttpServer::stats_loop() {
  StatsLine line;
  std::unique_lock<std::mutex> lock(stats_mutex_);
  const auto interval = std::chrono::duration<double>(ctx_->options.stats_interval_s);
  while (!stats_cv_.wait_for(lock, interval, [this] { return stopping_; })) {
    if (!ctx_->ready) continue;
    if (auto text = line.update(ctx_->model.engine->stats(), ctx_->metrics)) {
      MX_LOG(kInfo) << *text;
    }
  }
}

}  // namespace mxserve::server
