// Http1Response: an incremental HTTP/1.1 response parser for one request on a connection.
// Owns: the status line and the headers that matter (Content-Length, Transfer-Encoding: chunked,
// Connection), skipping 1xx interim responses, and body framing: Content-Length, chunked
// (extensions and trailers ignored) or until the connection closes. Body bytes are handed out as
// they arrive. Does not own sockets or what the body means.
// Invariant: feed() consumes bytes in any split and yields the same status and body bytes.
#pragma once

#include <cstdint>
#include <string>

namespace mxserve::bench {

class Http1Response {
 public:
  enum class State { kHead, kBody, kDone, kError };
  // Handles body bytes: void(const char* p, size_t n).
  template <typename OnBody>
  State feed(const char* p, size_t n, OnBody&& on_body);
  // The connection reached EOF: completes an until-close body, else an error.
  State on_eof();
  void reset();
  State state() const { return state_; }
  int status() const { return status_; }
  bool keep_alive() const { return keep_alive_ && framing_ != Framing::kUntilClose; }
  const std::string& error() const { return error_; }

 private:
  enum class Framing { kLength, kChunked, kUntilClose };
  enum class Chunk { kSize, kData, kDataCrlf, kTrailer };
  // Consumes head bytes; false when more are needed (or on error).
  bool parse_head(const char*& p, size_t& left);
  // Consumes one chunk-size or trailer line piece; false on error.
  bool chunk_line(const char*& p, size_t& left);
  State fail(std::string why) {
    error_ = std::move(why);
    return state_ = State::kError;
  }

  State state_ = State::kHead;
  int status_ = 0;
  bool keep_alive_ = true;
  Framing framing_ = Framing::kUntilClose;
  Chunk chunk_ = Chunk::kSize;
  int64_t remaining_ = 0;
  std::string line_;   // partial head / chunk line
  std::string error_;
};

template <typename OnBody>
Http1Response::State Http1Response::feed(const char* p, size_t left, OnBody&& on_body) {
  while (state_ == State::kHead || state_ == State::kBody) {
    if (state_ == State::kHead) {
      if (!parse_head(p, left)) return state_;
      if (framing_ == Framing::kLength && remaining_ == 0) return state_ = State::kDone;
      continue;
    }
    if (left == 0) return state_;
    if (framing_ == Framing::kUntilClose) {
      on_body(p, left);
      return state_;
    }
    if (framing_ == Framing::kLength) {
      const size_t k = left < static_cast<size_t>(remaining_) ? left : static_cast<size_t>(remaining_);
      on_body(p, k);
      p += k;
      left -= k;
      remaining_ -= static_cast<int64_t>(k);
      if (remaining_ == 0) state_ = State::kDone;
      continue;
    }
    if (chunk_ == Chunk::kData || chunk_ == Chunk::kDataCrlf) {
      const size_t k = left < static_cast<size_t>(remaining_) ? left : static_cast<size_t>(remaining_);
      if (chunk_ == Chunk::kData) on_body(p, k);
      p += k;
      left -= k;
      remaining_ -= static_cast<int64_t>(k);
      if (remaining_ == 0) {
        chunk_ = chunk_ == Chunk::kData ? Chunk::kDataCrlf : Chunk::kSize;
        remaining_ = chunk_ == Chunk::kDataCrlf ? 2 : 0;
      }
      continue;
    }
    if (!chunk_line(p, left)) return state_;
  }
  return state_;
}

}  // namespace mxserve::bench
