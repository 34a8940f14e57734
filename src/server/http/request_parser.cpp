#include "server/http/request_parser.h"

#include <cstring>

namespace mxserve::server::http {
namespace {

constexpr size_t kMaxChunkSizeLine = 1024;  // hex size + extensions
constexpr size_t kMaxMethodBytes = 32;

bool is_tchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!is_tchar(c)) return false;
  return true;
}

// Field-value characters: visible, obs-text, SP, HTAB. CR, LF, NUL and other controls are refused.
bool valid_value(std::string_view s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  return true;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Calls fn(element) for each comma-separated, OWS-trimmed, non-empty element of a list-valued field.
template <typename F>
void for_each_element(std::string_view v, F fn) {
  while (!v.empty()) {
    const size_t comma = v.find(',');
    std::string_view e = trim_ows(v.substr(0, comma));
    if (!e.empty()) fn(e);
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
}

// Strips one trailing CR (lines end in CRLF; a bare LF is tolerated as RFC 9112 allows).
std::string_view chomp(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

}  // namespace

bool RequestParser::fail(int status, std::string message) {
  state_ = State::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  return false;
}

void RequestParser::reset() {
  state_ = State::kHead;
  req_ = Request();
  head_scan_ = 0;
  started_ = false;
  framing_ = Framing::kNone;
  content_length_ = 0;
  chunk_left_ = 0;
  chunk_state_ = ChunkState::kSize;
  trailer_bytes_ = 0;
  trailer_count_ = 0;
  keep_alive_ = true;
  expect_continue_ = false;
}

Request RequestParser::take_request() {
  Request out = std::move(req_);
  reset();
  return out;
}

size_t RequestParser::parse(std::string_view data) {
  size_t used = 0;
  if (state_ == State::kHead) used += parse_head(data);
  if (state_ == State::kBody) used += parse_body(data.substr(used));
  return used;
}

size_t RequestParser::parse_head(std::string_view data) {
  size_t skipped = 0;
  if (head_scan_ == 0) {  // empty lines before a request line are ignored (RFC 9112 2.2)
    while (skipped < data.size() && (data[skipped] == '\r' || data[skipped] == '\n')) ++skipped;
    data.remove_prefix(skipped);
  }
  if (!data.empty()) started_ = true;
  size_t line_start = head_scan_;
  size_t end = std::string_view::npos;
  while (line_start < data.size()) {
    const size_t nl = data.find('\n', line_start);
    if (nl == std::string_view::npos) break;
    if (line_start == 0 && nl > limits_.max_request_line_bytes) break;
    if (line_start > 0 && chomp(data.substr(line_start, nl - line_start)).empty()) {
      end = nl + 1;
      break;
    }
    line_start = nl + 1;
  }
  if (end == std::string_view::npos) {
    head_scan_ = line_start;
    const size_t first_nl = data.find('\n');
    if ((first_nl == std::string_view::npos && data.size() > limits_.max_request_line_bytes) ||
        (first_nl != std::string_view::npos && first_nl > limits_.max_request_line_bytes)) {
      fail(414, "the request line is longer than " + std::to_string(limits_.max_request_line_bytes) + " bytes");
      return skipped;
    }
    if (data.size() > limits_.max_header_bytes)
      fail(431, "the request head is larger than " + std::to_string(limits_.max_header_bytes) + " bytes");
    return skipped;
  }
  if (end > limits_.max_header_bytes) {
    fail(431, "the request head is larger than " + std::to_string(limits_.max_header_bytes) + " bytes");
    return skipped;
  }
  if (parse_head_block(data.substr(0, end)) && apply_framing()) state_ = State::kHeadDone;
  return skipped + end;
}

bool RequestParser::parse_head_block(std::string_view head) {
  size_t pos = 0;
  bool first = true;
  while (pos < head.size()) {
    const size_t nl = head.find('\n', pos);
    std::string_view line = chomp(head.substr(pos, nl - pos));
    pos = nl + 1;
    if (first) {
      if (!parse_request_line(line)) return false;
      first = false;
      continue;
    }
    if (line.empty()) break;
    if (!parse_header_line(line, /*trailer=*/false)) return false;
  }
  return true;
}

bool RequestParser::parse_request_line(std::string_view line) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line (expected 'METHOD target HTTP/1.1')");
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method) || method.size() > kMaxMethodBytes) return fail(400, "malformed request method");
  if (version == "HTTP/1.1") req_.version_minor = 1;
  else if (version == "HTTP/1.0") req_.version_minor = 0;
  else if (version.substr(0, 5) == "HTTP/") return fail(505, "only HTTP/1.0 and HTTP/1.1 are supported");
  else return fail(400, "malformed request line (expected 'METHOD target HTTP/1.1')");
  if (target.empty()) return fail(400, "empty request target");
  for (unsigned char c : target)
    if (c <= 0x20 || c == 0x7f) return fail(400, "the request target contains a control character");
  std::string_view path = target;
  if (path.substr(0, 7) == "http://" || path.substr(0, 8) == "https://") {  // absolute-form
    const size_t slash = path.find('/', path.find("//") + 2);
    path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
  } else if (path.front() != '/' && path != "*") {
    return fail(400, "the request target must start with '/'");
  }
  const size_t q = path.find('?');
  req_.method = std::string(method);
  req_.target = std::string(target);
  req_.path = std::string(path.substr(0, q));
  req_.query = q == std::string_view::npos ? "" : std::string(path.substr(q + 1));
  keep_alive_ = req_.version_minor == 1;
  return true;
}

bool RequestParser::parse_header_line(std::string_view line, bool trailer) {
  if (line.front() == ' ' || line.front() == '\t')
    return fail(400, "obsolete line folding in a header field is not accepted");
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return fail(400, "a header line without ':'");
  const std::string_view name = line.substr(0, colon);
  if (!is_token(name)) return fail(400, "invalid header field name (no whitespace is allowed before ':')");
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  if (!valid_value(value)) return fail(400, "header field '" + std::string(name.substr(0, 64)) +
                                                "' contains a control character (CR, LF, NUL, ...)");
  if (trailer) {
    if (++trailer_count_ > limits_.max_header_count)
      return fail(431, "more than " + std::to_string(limits_.max_header_count) + " trailer fields");
    return true;  // trailers are checked and dropped
  }
  if (req_.headers.size() >= limits_.max_header_count)
    return fail(431, "more than " + std::to_string(limits_.max_header_count) + " header fields");
  req_.headers.push_back(Header{to_lower(name), std::string(value)});
  return true;
}

bool RequestParser::apply_framing() {
  bool chunked = false, has_te = false, has_length = false;
  uint64_t length = 0;
  for (const Header& h : req_.headers) {
    if (h.name == "transfer-encoding") {
      has_te = true;
      bool ok = true;
      int n = 0;
      for_each_element(h.value, [&](std::string_view e) {
        ++n;
        if (iequals(e, "chunked") && !chunked) chunked = true;
        else ok = false;
      });
      if (!ok || n == 0)
        return fail(501, "Transfer-Encoding '" + std::string(trim_ows(h.value).substr(0, 64)) +
                             "' is not supported (only 'chunked')");
    } else if (h.name == "content-length") {
      bool ok = true;
      for_each_element(h.value, [&](std::string_view e) {
        uint64_t v = 0;
        if (e.size() > 18) ok = false;
        for (char c : e) {
          if (c < '0' || c > '9') ok = false;
          v = v * 10 + static_cast<uint64_t>(c - '0');
        }
        if (has_length && v != length) ok = false;
        has_length = true;
        length = v;
      });
      if (!ok || !has_length) return fail(400, "invalid or conflicting Content-Length");
    } else if (h.name == "connection") {
      for_each_element(h.value, [&](std::string_view e) {
        if (iequals(e, "close")) keep_alive_ = false;
        else if (iequals(e, "keep-alive") && req_.version_minor == 0) keep_alive_ = true;
      });
    } else if (h.name == "expect") {
      if (!iequals(trim_ows(h.value), "100-continue")) return fail(417, "only 'Expect: 100-continue' is supported");
      expect_continue_ = req_.version_minor == 1;
    } else if (h.name == "content-encoding") {
      bool identity = true;
      for_each_element(h.value, [&](std::string_view e) { identity = identity && iequals(e, "identity"); });
      if (!identity)
        return fail(415, "Content-Encoding '" + std::string(trim_ows(h.value).substr(0, 64)) +
                             "' is not accepted: send the body uncompressed");
    }
  }
  if (has_te && has_length) return fail(400, "both Transfer-Encoding and Content-Length (ambiguous framing)");
  if (has_te && req_.version_minor == 0) return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
  if (chunked) {
    framing_ = Framing::kChunked;
  } else if (has_length) {
    if (length > limits_.max_body_bytes)
      return fail(413, "the body (" + std::to_string(length) + " bytes) is larger than the limit of " +
                           std::to_string(limits_.max_body_bytes) + " bytes");
    framing_ = Framing::kLength;
    content_length_ = length;
  } else if (req_.method == "POST" || req_.method == "PUT" || req_.method == "PATCH") {
    return fail(411, "a request body needs Content-Length or Transfer-Encoding: chunked");
  }
  return true;
}

void RequestParser::begin_body() {
  if (state_ != State::kHeadDone) return;
  state_ = has_body() ? State::kBody : State::kDone;
}

size_t RequestParser::parse_body(std::string_view data) {
  if (framing_ == Framing::kChunked) return parse_chunked(data);
  const uint64_t left = content_length_ - req_.body.size();
  const size_t take = static_cast<size_t>(std::min<uint64_t>(left, data.size()));
  req_.body.append(data.data(), take);
  if (req_.body.size() == content_length_) state_ = State::kDone;
  return take;
}

size_t RequestParser::parse_chunked(std::string_view data) {
  size_t pos = 0;
  while (state_ == State::kBody && pos < data.size()) {
    const std::string_view rest = data.substr(pos);
    switch (chunk_state_) {
      case ChunkState::kSize: {
        const size_t nl = rest.find('\n');
        if (nl == std::string_view::npos) {
          if (rest.size() > kMaxChunkSizeLine) fail(400, "a chunk-size line is too long");
          return pos;
        }
        if (nl > kMaxChunkSizeLine) {
          fail(400, "a chunk-size line is too long");
          return pos;
        }
        std::string_view line = chomp(rest.substr(0, nl));
        const size_t semi = line.find(';');  // chunk extensions are ignored
        std::string_view hex = line.substr(0, semi);
        while (!hex.empty() && (hex.back() == ' ' || hex.back() == '\t')) hex.remove_suffix(1);
        if (hex.empty() || hex.size() > 15) {
          fail(400, "invalid chunk size");
          return pos;
        }
        uint64_t size = 0;
        for (char c : hex) {
          int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
          if (d < 0) {
            fail(400, "invalid chunk size");
            return pos;
          }
          size = size * 16 + static_cast<uint64_t>(d);
        }
        if (req_.body.size() + size > limits_.max_body_bytes) {
          fail(413, "the decoded chunked body exceeds the limit of " + std::to_string(limits_.max_body_bytes) + " bytes");
          return pos;
        }
        pos += nl + 1;
        chunk_left_ = size;
        chunk_state_ = size == 0 ? ChunkState::kTrailer : ChunkState::kData;
        break;
      }
      case ChunkState::kData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(chunk_left_, rest.size()));
        req_.body.append(rest.data(), take);
        chunk_left_ -= take;
        pos += take;
        if (chunk_left_ == 0) chunk_state_ = ChunkState::kDataEnd;
        break;
      }
      case ChunkState::kDataEnd: {
        if (rest[0] == '\n') {
          pos += 1;
        } else if (rest[0] == '\r') {
          if (rest.size() < 2) return pos;
          if (rest[1] != '\n') {
            fail(400, "a chunk is not followed by CRLF");
            return pos;
          }
          pos += 2;
        } else {
          fail(400, "a chunk is not followed by CRLF");
          return pos;
        }
        chunk_state_ = ChunkState::kSize;
        break;
      }
      case ChunkState::kTrailer: {
        const size_t nl = rest.find('\n');
        if (nl == std::string_view::npos) {
          if (trailer_bytes_ + rest.size() > limits_.max_header_bytes) fail(431, "the chunked trailer section is too large");
          return pos;
        }
        trailer_bytes_ += nl + 1;
        if (trailer_bytes_ > limits_.max_header_bytes) {
          fail(431, "the chunked trailer section is too large");
          return pos;
        }
        std::string_view line = chomp(rest.substr(0, nl));
        pos += nl + 1;
        if (line.empty()) {
          state_ = State::kDone;
        } else if (!parse_header_line(line, /*trailer=*/true)) {
          return pos;
        }
        break;
      }
    }
  }
  return pos;
}

}  // namespace mxserve::server::http
