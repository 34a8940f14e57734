// HttpServer: the OpenAI-compatible HTTP front end (cpp-httplib). Owns the listening socket, routes,
// authentication, body-size limits, the catch-all error and exception handlers, and the periodic
// stats line. Lifecycle: bind() -> start() (serving; /health is 503) -> set_ready(model) (/health 200)
// -> begin_drain() (new work 503) -> stop(). Handlers never throw into the library: any escaped
// exception becomes a 500 and the server keeps going.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "core/status.h"
#include "server/server_context.h"

namespace httplib {
class Server;
}

namespace mxserve::server {

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();

  Status bind();            // host:port; port 0 picks an ephemeral port
  int port() const { return port_; }
  void start();             // serves on a background thread
  void set_ready(ModelServices model);
  void begin_drain();
  // Waits until no generation request is in flight or the timeout passes.
  void wait_idle(double timeout_s);
  void stop();              // stops accepting, ends open streams, joins

  ServerContext& context() { return *ctx_; }

 private:
  void install_routes();
  void stats_loop();

  std::unique_ptr<ServerContext> ctx_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listen_thread_;
  std::thread stats_thread_;
  std::mutex stats_mutex_;
  std::condition_variable stats_cv_;
  bool stopping_ = false;
  int port_ = 0;
  int listen_fd_ = -1;
  std::atomic<int> in_flight_{0};
};

}  // namespace mxserve::server
