// HttpLimits: every bound the HTTP layer enforces on a client, in one place (flags of `mxserve serve`,
// documented in docs/server.md "Limits and hostile clients"). Invariant: with these bounds, what one
// connection can make the server hold is O(max_header_bytes + max_body_bytes + max_pending_output),
// and no connection holds a thread unless a complete request is being handled.
#pragma once

#include <cstddef>

namespace mxserve::server::http {

struct HttpLimits {
  size_t max_request_line_bytes = 8 << 10;  // request line longer: 414
  size_t max_header_bytes = 32 << 10;       // request line + header block (and chunked trailers): 431
  size_t max_header_count = 100;            // header fields (and trailer fields): 431
  size_t max_body_bytes = 8u << 20;         // decoded body bytes, every transfer form: 413
  double header_timeout_s = 10;             // whole request head, from its first byte (a new connection: from accept)
  double body_timeout_s = 60;               // whole body, from the end of the head
  double keepalive_timeout_s = 30;          // idle time between requests on a kept-alive connection
  double write_timeout_s = 30;              // pending response bytes with no write progress: the client is gone
  size_t max_connections = 8192;            // open connections; beyond, the oldest idle/slow one is closed
  int max_handler_threads = 2048;           // requests handled at once (idle connections hold no thread)
  size_t max_queued_handlers = 2048;        // complete requests waiting for a handler thread; beyond: 503
  size_t max_pending_output = 1 << 20;      // unsent response bytes per connection before a streaming writer waits
  size_t max_pipelined_bytes = 64 << 10;    // bytes read ahead (pipelined requests) while a request is handled
  double linger_timeout_s = 2;              // after an early error: discard the unread body this long, then close
};

}  // namespace mxserve::server::http
