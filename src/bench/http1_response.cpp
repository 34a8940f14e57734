// Http1Response head and chunk-line parsing (see http1_response.h).
#include "bench/http1_response.h"

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace mxserve::bench {
namespace {

constexpr size_t kMaxHead = 64 * 1024;
constexpr size_t kMaxChunkLine = 4096;

bool has_prefix_ci(const char* p, size_t n, const char* name) {
  const size_t len = std::strlen(name);
  if (n < len) return false;
  for (size_t i = 0; i < len; ++i)
    if (std::tolower(static_cast<unsigned char>(p[i])) != name[i]) return false;
  return true;
}

std::string lower(const char* p, size_t n) {
  std::string v(p, n);
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return v;
}

}  // namespace

void Http1Response::reset() { *this = Http1Response(); }

Http1Response::State Http1Response::on_eof() {
  if (state_ == State::kBody && framing_ == Framing::kUntilClose) return state_ = State::kDone;
  if (state_ == State::kDone || state_ == State::kError) return state_;
  return fail(state_ == State::kHead && line_.empty() ? "connection closed before a response"
                                                       : "connection closed mid-response");
}

bool Http1Response::parse_head(const char*& p, size_t& left) {
  const size_t old = line_.size();
  line_.append(p, left);
  const size_t end = line_.find("\r\n\r\n", old >= 3 ? old - 3 : 0);
  if (end == std::string::npos) {
    p += left;
    left = 0;
    if (line_.size() > kMaxHead) fail("response head over 64 KiB");
    return false;
  }
  const size_t used = end + 4 - old;
  p += used;
  left -= used;
  const std::string head = line_.substr(0, end);
  line_.clear();
  if (head.size() < 12 || head.compare(0, 5, "HTTP/") != 0) {
    fail("malformed response head");
    return false;
  }
  const int status = std::atoi(head.c_str() + 9);
  if (status >= 100 && status < 200) return true;  // interim: the real head follows
  status_ = status;
  keep_alive_ = head.compare(5, 3, "1.1") == 0;
  framing_ = Framing::kUntilClose;
  size_t pos = head.find("\r\n");
  while (pos != std::string::npos) {
    const size_t start = pos + 2;
    const size_t next = head.find("\r\n", start);
    const size_t len = (next == std::string::npos ? head.size() : next) - start;
    const char* l = head.data() + start;
    if (has_prefix_ci(l, len, "content-length:")) {
      if (framing_ != Framing::kChunked) {
        framing_ = Framing::kLength;
        remaining_ = std::strtoll(l + 15, nullptr, 10);
        if (remaining_ < 0) {
          fail("negative Content-Length");
          return false;
        }
      }
    } else if (has_prefix_ci(l, len, "transfer-encoding:")) {
      if (lower(l + 18, len - 18).find("chunked") != std::string::npos) {
        framing_ = Framing::kChunked;
        chunk_ = Chunk::kSize;
        remaining_ = 0;
      }
    } else if (has_prefix_ci(l, len, "connection:")) {
      const std::string v = lower(l + 11, len - 11);
      if (v.find("close") != std::string::npos) keep_alive_ = false;
      if (v.find("keep-alive") != std::string::npos) keep_alive_ = true;
    }
    pos = next;
  }
  state_ = State::kBody;
  return true;
}

bool Http1Response::chunk_line(const char*& p, size_t& left) {
  const void* nl = std::memchr(p, '\n', left);
  const size_t k = nl ? static_cast<size_t>(static_cast<const char*>(nl) - p) + 1 : left;
  line_.append(p, k);
  p += k;
  left -= k;
  if (!nl) {
    if (line_.size() > kMaxChunkLine) {
      fail("chunk header line too long");
      return false;
    }
    return true;
  }
  std::string l = std::move(line_);
  line_.clear();
  while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
  if (chunk_ == Chunk::kTrailer) {
    if (l.empty()) state_ = State::kDone;
    return true;
  }
  char* end = nullptr;
  const long long size = std::strtoll(l.c_str(), &end, 16);
  if (end == l.c_str() || size < 0) {
    fail("bad chunk size '" + l.substr(0, 20) + "'");
    return false;
  }
  chunk_ = size == 0 ? Chunk::kTrailer : Chunk::kData;
  remaining_ = size;
  return true;
}

}  // namespace mxserve::bench
