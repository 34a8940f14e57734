// HttpServer: the OpenAI-compatible front end on our own HTTP/1.1 layer (server/http/). Owns the route
// table (which handlers run inline on the event loop -- /health, /metrics, /v1/models -- and which on a
// worker -- the generation endpoints), the API key (checked from the head, before any body byte is
// read), the OpenAI error bodies for HTTP-level errors, response metrics, and the periodic stats line.
// Lifecycle: bind() -> start() (serving; /health is 503) -> set_ready(model) (/health 200) ->
// begin_drain() (new work 503) -> stop(). Handlers never throw into the layer: an escaped exception
// becomes a 500 and the server keeps going.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "core/status.h"
#include "server/http/event_loop.h"
#include "server/cors.h"
#include "server/http/service.h"
#include "server/server_context.h"

namespace mxserve::server {

class HttpServer : private http::Service {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer() override;

  Status bind();            // host:port; port 0 picks an ephemeral port
  int port() const { return loop_->port(); }
  void start();             // serves on a background thread
  void set_ready(ModelServices model);
  void begin_drain();
  // Waits until no generation request is in flight or the timeout passes.
  void wait_idle(double timeout_s);
  void stop();              // stops accepting, ends open streams, joins

  ServerContext& context() { return *ctx_; }
  size_t open_connections() const { return loop_->open_connections(); }

 private:
  enum class Route { kNone, kHealth, kMetrics, kModels, kChat, kCompletions, kMessages, kCountTokens,
                     kModelById, kVersion, kTokenize, kDetokenize };
  static Route route_of(const http::Request& req);

  std::optional<http::Response> admit(const http::Request& head) override;
  bool runs_inline(const http::Request& req) const override;
  void handle(const http::Request& req, http::Response& res) override;
  http::Response error(int status, const std::string& message) override;
  void on_response(int status) override;

  void stats_loop();
  // Reads the engine's spec counters into the acceptance alarm; logs its state changes.
  void check_spec_alarm(const runtime::EngineStats& stats);

  std::unique_ptr<ServerContext> ctx_;
  std::unique_ptr<http::EventLoop> loop_;
  std::thread stats_thread_;
  std::mutex stats_mutex_;
  std::condition_variable stats_cv_;
  bool stopping_ = false;
  std::atomic<int> in_flight_{0};
  CorsPolicy cors_;
};

}  // namespace mxserve::server
