// CORS: which browser origins may call the API (--allowed-origins; off by default, so a page on another origin
// cannot read responses). Owns the preflight answer (OPTIONS + Access-Control-Request-Method) and the
// Access-Control-Allow-Origin header on ordinary responses. Invariant: a response carries
// Access-Control-Allow-Origin only for an allowed origin, never for a request without an Origin header.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/http/message.h"

namespace mxserve::server {

class CorsPolicy {
 public:
  CorsPolicy() = default;
  explicit CorsPolicy(std::vector<std::string> origins) : origins_(std::move(origins)) {}
  bool enabled() const { return !origins_.empty(); }
  // The Access-Control-Allow-Origin value for this request's Origin ("*" when every origin is allowed), or
  // nullopt: no Origin header, CORS off, or an origin not in the list.
  std::optional<std::string> allow_origin(const http::Request& req) const;
  // Adds the CORS headers of an ordinary response (nothing when the origin is not allowed).
  void add_headers(const http::Request& req, http::Response& res) const;
  // An OPTIONS preflight: 204 with the allowed methods and headers, or 400 naming the refused origin. nullopt when
  // CORS is off or the request is not a preflight (the route table answers it: 404).
  std::optional<http::Response> preflight(const http::Request& req) const;

 private:
  std::vector<std::string> origins_;  // exact origins ("https://ui.example:8080") or "*"
};

// --allowed-origins: a comma-separated list or a JSON list of origins ('["http://localhost:3000"]'); "*" allows
// every origin. Each origin is scheme://host[:port] without a path. Errors name the flag and the bad entry.
Result<std::vector<std::string>> parse_allowed_origins(const std::string& text);

}  // namespace mxserve::server
