// The handler-facing HTTP types: Request (parsed, body decoded and size-checked), Response (status,
// headers, body -- or a stream), StreamWriter (chunked/SSE output) and the "client gone" signal.
// Invariant: a handler sees only complete, limit-checked requests; it either fills Response and returns
// (the server writes it) or calls Response::stream() once and writes through the StreamWriter, which
// reports false as soon as the client is gone (disconnect, write timeout, server stopping).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mxserve::server::http {

struct Header {
  std::string name;   // lower case
  std::string value;  // leading whitespace removed; trailing whitespace kept (see Request::raw_header)
};

// Lower-cases ASCII letters.
std::string to_lower(std::string_view s);
// Removes leading and trailing spaces and tabs (HTTP "OWS").
std::string_view trim_ows(std::string_view s);

struct Request {
  std::string method;  // as sent (methods are case-sensitive)
  std::string target;  // request target as sent
  std::string path;    // target up to '?'
  std::string query;   // after '?', without it
  int version_minor = 1;  // HTTP/1.x
  std::vector<Header> headers;
  std::string body;    // decoded (chunked framing removed)
  std::string remote_addr;
  int remote_port = 0;

  // The first field with this (lower-case) name, OWS-trimmed; empty when absent.
  std::string_view header(std::string_view lower_name) const;
  // The first field's value exactly as received after the leading whitespace (trailing kept); nullptr when absent.
  const std::string* raw_header(std::string_view lower_name) const;
  bool has_header(std::string_view lower_name) const { return raw_header(lower_name) != nullptr; }
};

// The output side of one exchange, implemented by the connection (channel.h). Thread-safe.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Queues bytes for the client; waits while too much is unsent. False once the client is gone.
  virtual bool send(std::string_view bytes) = 0;
  virtual bool client_gone() const = 0;
};

class StreamWriter {
 public:
  StreamWriter(ResponseSink* sink, bool chunked) : sink_(sink), chunked_(chunked) {}
  // Writes one piece of the body (one chunk). False once the client is gone: stop producing.
  bool write(const char* data, size_t size);
  bool write(std::string_view s) { return write(s.data(), s.size()); }
  // Ends the body (the terminating chunk). Without it the connection is closed, so the client sees a
  // truncated response.
  void done();
  bool finished() const { return done_; }
  bool client_gone() const { return sink_->client_gone(); }

 private:
  ResponseSink* sink_;
  bool chunked_;
  bool done_ = false;
};

class Response {
 public:
  int status = 200;
  std::vector<Header> headers;  // extra headers (Content-Type/-Length and Connection are the server's)
  std::string body;
  std::string content_type;

  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_header(std::string name, std::string value) { headers.push_back({std::move(name), std::move(value)}); }

  // True once the client disconnected (or the server is stopping): abandon the work.
  bool client_gone() const { return sink_ && sink_->client_gone(); }
  // Sends the status line and headers now and returns the body writer (chunked on HTTP/1.1; on HTTP/1.0
  // the body runs to the connection's close). Call at most once, only from a worker-thread handler.
  StreamWriter& stream(std::string type);
  bool streaming() const { return writer_ != nullptr; }
  StreamWriter* writer() { return writer_.get(); }

  // Set by the server before the handler runs.
  void attach(ResponseSink* sink, int version_minor, bool keep_alive) {
    sink_ = sink;
    version_minor_ = version_minor;
    keep_alive_ = keep_alive;
  }
  bool keep_alive() const { return keep_alive_; }

 private:
  ResponseSink* sink_ = nullptr;
  int version_minor_ = 1;
  bool keep_alive_ = true;
  std::unique_ptr<StreamWriter> writer_;
};

}  // namespace mxserve::server::http
