// A small libcurl client for the server tests: plain requests, SSE streams (optionally hanging up after
// a number of events, to test disconnects), and raw bodies (invalid UTF-8, huge payloads).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace mxserve::server::testing {

struct HttpResult {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  int curl_code = 0;
};

HttpResult http_request(const std::string& method, const std::string& url, const std::string& body,
                        const std::vector<std::string>& headers, long timeout_ms = 120000);

struct SseResult {
  long status = 0;
  std::vector<std::string> events;  // the payloads of "data: " lines, in order ("[DONE]" included)
  std::string raw;
  int curl_code = 0;
};

// hang_up_after >= 0: closes the connection once that many events arrived.
SseResult http_stream(const std::string& url, const std::string& body, const std::vector<std::string>& headers,
                      int hang_up_after = -1, long timeout_ms = 120000);

}  // namespace mxserve::server::testing
