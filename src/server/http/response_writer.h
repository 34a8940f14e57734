// Response serialization: status line + headers (Content-Type, Content-Length or chunked framing,
// Connection) and chunk framing. Invariant: every response the server writes is framed (a length, a
// chunked body, or -- HTTP/1.0 streams only -- the connection's close), so a client or proxy can never
// read one response's bytes as part of another; header names/values with CR, LF or NUL are dropped.
#pragma once

#include <string>
#include <string_view>

#include "server/http/message.h"

namespace mxserve::server::http {

const char* reason_phrase(int status);

enum class BodyFraming { kLength, kChunked, kUntilClose };

// The status line and header block (ending with the blank line).
std::string serialize_head(const Response& res, int version_minor, bool keep_alive, BodyFraming framing,
                           size_t content_length);
// A complete length-framed response.
std::string serialize_response(const Response& res, int version_minor, bool keep_alive);

void append_chunk(std::string* out, std::string_view data);  // "<hex size>\r\n<data>\r\n"; nothing for empty data
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace mxserve::server::http
