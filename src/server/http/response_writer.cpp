#include "server/http/response_writer.h"

#include <cstdio>

namespace mxserve::server::http {
namespace {

bool clean(std::string_view s) {
  for (char c : s)
    if (c == '\r' || c == '\n' || c == '\0') return false;
  return true;
}

void add(std::string* out, std::string_view name, std::string_view value) {
  out->append(name);
  out->append(": ");
  out->append(value);
  out->append("\r\n");
}

}  // namespace

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

std::string serialize_head(const Response& res, int version_minor, bool keep_alive, BodyFraming framing,
                           size_t content_length) {
  std::string out;
  out.reserve(256);
  out.append(version_minor == 0 ? "HTTP/1.0 " : "HTTP/1.1 ");
  out.append(std::to_string(res.status));
  out.push_back(' ');
  out.append(reason_phrase(res.status));
  out.append("\r\n");
  if (!res.content_type.empty() && clean(res.content_type)) add(&out, "Content-Type", res.content_type);
  switch (framing) {
    case BodyFraming::kLength: add(&out, "Content-Length", std::to_string(content_length)); break;
    case BodyFraming::kChunked: add(&out, "Transfer-Encoding", "chunked"); break;
    case BodyFraming::kUntilClose: break;
  }
  for (const Header& h : res.headers) {
    if (h.name.empty() || !clean(h.name) || !clean(h.value)) continue;
    add(&out, h.name, h.value);
  }
  if (!keep_alive) add(&out, "Connection", "close");
  else if (version_minor == 0) add(&out, "Connection", "keep-alive");
  out.append("\r\n");
  return out;
}

std::string serialize_response(const Response& res, int version_minor, bool keep_alive) {
  std::string out = serialize_head(res, version_minor, keep_alive, BodyFraming::kLength, res.body.size());
  out.append(res.body);
  return out;
}

void append_chunk(std::string* out, std::string_view data) {
  if (data.empty()) return;  // an empty chunk would end the body
  char size[24];
  const int n = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  out->append(size, static_cast<size_t>(n));
  out->append(data);
  out->append("\r\n");
}

}  // namespace mxserve::server::http
