// A blocking GET for the bench's control requests (/v1/models, /metrics): not the load path.
#pragma once

#include <string>

#include "core/status.h"

namespace mxserve::bench {

struct HttpGetResult {
  long status = 0;   // HTTP status code
  std::string body;
};

// kUnavailable naming the URL when the transfer itself fails (connection refused, timeout).
Result<HttpGetResult> http_get(const std::string& url, const std::string& api_key, long timeout_ms);

}  // namespace mxserve::bench
