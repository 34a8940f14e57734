// Service: what the HTTP layer calls into (implemented by server/http_server.cpp: routes, API key,
// OpenAI error bodies, metrics). The layer owns framing, limits, timeouts and threads; the service owns
// meaning. Invariant: admit() and inline handlers run on the event loop and must never block; every other
// handler runs on a worker thread.
#pragma once

#include <optional>
#include <string>

#include "server/http/message.h"

namespace mxserve::server::http {

class Service {
 public:
  virtual ~Service() = default;
  // Once the head is complete, before any body byte is read: a response to send instead (the body is
  // then never read, and the connection closes if one was announced), or nullopt to go on.
  virtual std::optional<Response> admit(const Request& head) = 0;
  // True when the handler is cheap and never blocks: it runs on the event loop.
  virtual bool runs_inline(const Request& req) const = 0;
  virtual void handle(const Request& req, Response& res) = 0;
  // The response for an HTTP-level error (malformed request, a limit, a timeout, overload).
  virtual Response error(int status, const std::string& message) = 0;
  // Called once per response with its status (499: the client left before the response).
  virtual void on_response(int status) = 0;
};

}  // namespace mxserve::server::http
