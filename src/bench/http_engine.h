// HttpEngine: the transport under the load runner's scheduling loop. Two implementations:
//  - NativeEngine (native_engine.cpp): a small epoll HTTP/1.1 client for http:// URLs, one recv
//    per readiness event, chunked decoding feeding the SSE reader directly. Default for http://.
//  - CurlEngine (curl_engine.cpp): libcurl multi with socket callbacks; used for https:// and on
//    request (--http-client curl). NOTE: measured 2-3x more CPU per SSE event than NativeEngine on
//    curl 7.88 (it polls the socket after every read and keeps more per-transfer state), see
//    docs/perf/bench-client.md.
// Invariant: wait() returns after at most `timeout_s` and reports every request it completed to
// the tracker (RunTracker::finish) before returning.
#pragma once

#include <memory>

#include "bench/run_tracker.h"
#include "core/status.h"

namespace mxserve::bench {

class HttpEngine {
 public:
  virtual ~HttpEngine() = default;
  // Sends `t` (the tracker already stamped it sent).
  virtual Status start(std::unique_ptr<Transfer> t) = 0;
  // Blocks for I/O until something happens or timeout_s passes (inf: no limit).
  virtual Status wait(double timeout_s) = 0;
  // The engine's own next deadline on the tracker clock (timers, request timeouts); inf if none.
  virtual double next_deadline() const = 0;
  virtual int64_t in_flight() const = 0;
};

Result<std::unique_ptr<HttpEngine>> make_curl_engine(RunTracker& tracker);
Result<std::unique_ptr<HttpEngine>> make_native_engine(RunTracker& tracker);

}  // namespace mxserve::bench
