// RequestParser: an incremental HTTP/1.1 request parser that enforces HttpLimits while bytes arrive.
// Owns request-line/header syntax (RFC 9112 strictness where laxness enables smuggling: no obs-fold, no
// whitespace before ':', no CR/LF/NUL in values, one consistent Content-Length, Transfer-Encoding only
// "chunked" and never together with Content-Length), message framing (Content-Length, chunked with
// trailers, none), and the decoded-body cap.
// Invariant: the parser never holds more than max_header_bytes of an incomplete head or more than
// max_body_bytes of decoded body; anything beyond is an error status (431, 413, ...) the moment it is
// seen, before it is buffered.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "server/http/limits.h"
#include "server/http/message.h"

namespace mxserve::server::http {

class RequestParser {
 public:
  enum class State {
    kHead,      // reading the request line and headers
    kHeadDone,  // head parsed; the caller decides (admission) and calls begin_body()
    kBody,      // reading the body
    kDone,      // a complete request: take_request()
    kError,     // error_status() / error_message(); the connection must close after answering
  };
  enum class Framing { kNone, kLength, kChunked };

  explicit RequestParser(const HttpLimits& limits) : limits_(limits) {}

  // Parses from the front of `data`; returns how many bytes were consumed. Stops at kHeadDone, kDone or
  // kError; unconsumed bytes must be passed again (with more appended) on the next call.
  size_t parse(std::string_view data);
  void begin_body();                 // kHeadDone -> kBody (or kDone when there is no body)
  Request take_request();            // kDone -> kHead, ready for the next request on the connection
  void reset();                      // back to kHead, dropping any partial request

  State state() const { return state_; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  const Request& request() const { return req_; }
  Request& request() { return req_; }
  Framing framing() const { return framing_; }
  bool has_body() const { return framing_ == Framing::kChunked || (framing_ == Framing::kLength && content_length_ > 0); }
  bool keep_alive() const { return keep_alive_; }
  bool expects_continue() const { return expect_continue_; }
  // True once any byte of the current request arrived (false on an idle kept-alive connection).
  bool started() const { return started_; }

 private:
  size_t parse_head(std::string_view data);
  bool parse_head_block(std::string_view head);
  bool parse_request_line(std::string_view line);
  bool parse_header_line(std::string_view line, bool trailer);
  bool apply_framing();
  size_t parse_body(std::string_view data);
  size_t parse_chunked(std::string_view data);
  bool fail(int status, std::string message);

  enum class ChunkState { kSize, kData, kDataEnd, kTrailer };

  const HttpLimits limits_;  // a copy: a parser never outlives its limits
  State state_ = State::kHead;
  Request req_;
  size_t head_scan_ = 0;  // bytes of the pending head already scanned for its end (line starts)
  bool started_ = false;
  Framing framing_ = Framing::kNone;
  uint64_t content_length_ = 0;
  uint64_t chunk_left_ = 0;
  ChunkState chunk_state_ = ChunkState::kSize;
  size_t trailer_bytes_ = 0;
  size_t trailer_count_ = 0;
  bool keep_alive_ = true;
  bool expect_continue_ = false;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace mxserve::server::http
