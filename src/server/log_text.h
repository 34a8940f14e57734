// Client-supplied text on its way into a log line: control characters (newline, CR, ESC, NUL, ...) are
// escaped as \xNN and the text is cut to a bound, so a request can neither forge log lines, drive the
// terminal, nor grow the log without limit.
#pragma once

#include <string>
#include <string_view>

namespace mxserve::server {

std::string sanitize_for_log(std::string_view text, size_t max_bytes = 128);

}  // namespace mxserve::server
