#include "server/http/message.h"

#include <stdexcept>

#include "server/http/response_writer.h"

namespace mxserve::server::http {

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

const std::string* Request::raw_header(std::string_view lower_name) const {
  for (const Header& h : headers)
    if (h.name == lower_name) return &h.value;
  return nullptr;
}

std::string_view Request::header(std::string_view lower_name) const {
  const std::string* v = raw_header(lower_name);
  return v ? trim_ows(*v) : std::string_view();
}

bool StreamWriter::write(const char* data, size_t size) {
  if (done_) return false;
  if (size == 0) return !sink_->client_gone();
  if (!chunked_) return sink_->send(std::string_view(data, size));
  std::string framed;
  framed.reserve(size + 16);
  append_chunk(&framed, std::string_view(data, size));
  return sink_->send(framed);
}

void StreamWriter::done() {
  if (done_) return;
  done_ = true;
  if (chunked_) sink_->send(kLastChunk);
}

StreamWriter& Response::stream(std::string type) {
  if (!sink_) throw std::logic_error("Response::stream() needs a worker-thread handler");
  if (writer_) throw std::logic_error("Response::stream() called twice");
  content_type = std::move(type);
  const bool chunked = version_minor_ >= 1;
  if (!chunked) keep_alive_ = false;  // HTTP/1.0: the body ends when the connection closes
  sink_->send(serialize_head(*this, version_minor_, keep_alive_,
                             chunked ? BodyFraming::kChunked : BodyFraming::kUntilClose, 0));
  writer_ = std::make_unique<StreamWriter>(sink_, chunked);
  return *writer_;
}

}  // namespace mxserve::server::http
