#include "server/cors.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace mxserve::server {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

Status check_origin(const std::string& o) {
  if (o == "*") return Status::ok();
  const size_t p = o.find("://");
  const bool scheme_ok = p != std::string::npos && (o.compare(0, p, "http") == 0 || o.compare(0, p, "https") == 0);
  if (!scheme_ok || p + 3 >= o.size() || o.find('/', p + 3) != std::string::npos)
    return invalid_argument("--allowed-origins: '" + o +
                            "' is not an origin (scheme://host[:port], e.g. http://localhost:3000, or *)");
  return Status::ok();
}

}  // namespace

std::optional<std::string> CorsPolicy::allow_origin(const http::Request& req) const {
  if (origins_.empty()) return std::nullopt;
  const std::string* origin = req.raw_header("origin");
  if (origin == nullptr) return std::nullopt;
  const std::string o = trim(*origin);
  for (const auto& a : origins_) {
    if (a == "*") return std::string("*");
    if (a == o) return o;
  }
  return std::nullopt;
}

void CorsPolicy::add_headers(const http::Request& req, http::Response& res) const {
  if (origins_.empty()) return;
  res.set_header("Vary", "Origin");
  const auto allowed = allow_origin(req);
  if (!allowed) return;
  res.set_header("Access-Control-Allow-Origin", *allowed);
  res.set_header("Access-Control-Expose-Headers", "Retry-After, x-mxserve-simulated-acceptance");
}

std::optional<http::Response> CorsPolicy::preflight(const http::Request& req) const {
  if (origins_.empty() || req.method != "OPTIONS" || !req.has_header("access-control-request-method"))
    return std::nullopt;
  http::Response res;
  const auto allowed = allow_origin(req);
  if (!allowed) {
    const std::string* origin = req.raw_header("origin");
    nlohmann::json err = {{"error",
                           {{"message", "CORS: origin '" + (origin ? trim(*origin).substr(0, 256) : std::string()) +
                                            "' is not allowed (--allowed-origins)"},
                            {"type", "invalid_request_error"},
                            {"param", nullptr},
                            {"code", "cors_origin_not_allowed"}}}};
    res.status = 400;
    res.set_content(err.dump(), "application/json");
    res.set_header("Vary", "Origin");
    return res;
  }
  res.status = 204;
  res.set_header("Access-Control-Allow-Origin", *allowed);
  res.set_header("Vary", "Origin");
  res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  const std::string* hdrs = req.raw_header("access-control-request-headers");
  res.set_header("Access-Control-Allow-Headers", hdrs && !trim(*hdrs).empty() ? trim(*hdrs).substr(0, 1024)
                                                                               : std::string("Authorization, Content-Type"));
  res.set_header("Access-Control-Max-Age", "600");
  return res;
}

Result<std::vector<std::string>> parse_allowed_origins(const std::string& text) {
  std::vector<std::string> out;
  const std::string t = trim(text);
  if (!t.empty() && t.front() == '[') {
    auto j = nlohmann::json::parse(t, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) return invalid_argument("--allowed-origins: '" + t + "' is not a JSON list of strings");
    for (const auto& x : j) {
      if (!x.is_string()) return invalid_argument("--allowed-origins: every entry of the JSON list must be a string");
      out.push_back(trim(x.get<std::string>()));
    }
  } else {
    size_t start = 0;
    while (start <= t.size()) {
      const size_t comma = t.find(',', start);
      const std::string o = trim(t.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (!o.empty()) out.push_back(o);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (out.empty()) return invalid_argument("--allowed-origins: no origin given (e.g. http://localhost:3000, or *)");
  for (auto& o : out) {
    while (o.size() > 1 && o.back() == '/' && o.find("://") != std::string::npos && o.find('/', o.find("://") + 3) == o.size() - 1)
      o.pop_back();  // "http://x:3000/" -> "http://x:3000"
    if (Status s = check_origin(o); !s.is_ok()) return s;
  }
  return out;
}

}  // namespace mxserve::server
