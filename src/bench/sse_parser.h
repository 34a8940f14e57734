// SseParser: incremental Server-Sent-Events framing, robust to arbitrary chunk boundaries.
// Owns: splitting a byte stream into events (lines ending in \n, \r\n or \r; events end at a blank
// line), joining multi-line `data:` fields with '\n', skipping `:` comments and other fields.
// Does not own: what an event means (see openai_stream.h).
// Invariant: feeding a stream in any split yields the same events in the same order.
#pragma once

#include <string>
#include <string_view>

namespace mxserve::bench {

class SseParser {
 public:
  // Calls on_event(std::string_view data) for every complete event that carried a data field.
  template <typename F>
  void feed(const char* p, size_t n, F&& on_event) {
    if (n == 0) return;
    if (skip_lf_) {                                            // a \r ended the previous chunk
      skip_lf_ = false;
      if (p[0] == '\n') { ++p; --n; }
    }
    buf_.append(p, n);
    size_t pos = 0;
    const size_t size = buf_.size();
    while (pos < size) {
      size_t eol = pos;
      while (eol < size && buf_[eol] != '\n' && buf_[eol] != '\r') ++eol;
      if (eol == size) break;                                  // incomplete line
      size_t next = eol + 1;
      if (buf_[eol] == '\r') {
        if (next == size) skip_lf_ = true;                     // its \n, if any, comes next chunk
        else if (buf_[next] == '\n') ++next;
      }
      line(std::string_view(buf_).substr(pos, eol - pos), on_event);
      pos = next;
    }
    buf_.erase(0, pos);
  }
  // True once any bytes are pending (an unterminated event at stream end).
  bool has_partial() const { return !buf_.empty() || has_data_; }

 private:
  template <typename F>
  void line(std::string_view l, F& on_event) {
    if (l.empty()) {
      if (has_data_) {
        on_event(std::string_view(data_));
        data_.clear();
        has_data_ = false;
      }
      return;
    }
    if (l[0] == ':') return;
    size_t colon = l.find(':');
    std::string_view field = l.substr(0, colon);
    if (field != "data") return;
    std::string_view value = colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  }

  std::string buf_;
  std::string data_;
  bool has_data_ = false;
  bool skip_lf_ = false;
};

}  // namespace mxserve::bench
