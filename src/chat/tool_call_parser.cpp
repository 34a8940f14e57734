#include "chat/tool_call_parser.h"

#include "chat/text_scan.h"

namespace mxserve::chat {
namespace {

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";

void skip_spaces(std::string_view s, size_t* i) {
  while (*i < s.size() && is_space(s[*i])) ++*i;
}

// Reads "<open>TEXT<close>" at *i into *text.
bool read_element(std::string_view s, size_t* i, std::string_view open, std::string_view close, std::string_view* text) {
  if (s.substr(*i, open.size()) != open) return false;
  const size_t begin = *i + open.size();
  const size_t end = s.find(close, begin);
  if (end == std::string_view::npos) return false;
  *text = s.substr(begin, end - begin);
  *i = end + close.size();
  return true;
}

}  // namespace

ToolCallParser::ToolCallParser(std::shared_ptr<const ToolSet> tools)
    : tools_(tools ? std::move(tools) : std::make_shared<ToolSet>()) {}

bool ToolCallParser::parse_call(std::string_view body, ToolCall* call) const {
  size_t i = std::min(body.find(kKeyOpen), body.size());
  const std::string_view name = trim_spaces(body.substr(0, i));
  if (!valid_function_name(name)) return false;
  if (!tools_->empty() && !tools_->has(name)) return false;
  std::string args = "{";
  for (;;) {
    skip_spaces(body, &i);
    if (i == body.size()) break;
    std::string_view key, value;
    if (!read_element(body, &i, kKeyOpen, kKeyClose, &key)) return false;
    key = trim_spaces(key);
    if (key.empty() || key.find('<') != std::string_view::npos) return false;
    skip_spaces(body, &i);
    if (!read_element(body, &i, kValueOpen, kValueClose, &value)) return false;
    if (args.size() > 1) args += ",";
    args += nlohmann::ordered_json(std::string(key)).dump() + ":" + tools_->convert(name, key, value).dump();
  }
  call->name = std::string(name);
  call->arguments = args + "}";
  return true;
}

ToolCallDelta ToolCallParser::feed(std::string_view chunk) {
  pending_.append(chunk);
  ToolCallDelta out;
  for (;;) {
    if (state_ == State::kText) {
      const size_t start = pending_.find(kCallOpen);
      if (start == std::string::npos) {
        const size_t keep = partial_tag_suffix(pending_, kCallOpen);
        out.content.append(pending_, 0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return out;
      }
      out.content.append(pending_, 0, start);
      pending_.erase(0, start);
      state_ = State::kCall;
      continue;
    }
    const size_t end = pending_.find(kCallClose, kCallOpen.size());
    if (end == std::string::npos) return out;  // the call is still arriving
    const size_t raw_len = end + kCallClose.size();
    ToolCall call;
    if (parse_call(std::string_view(pending_).substr(kCallOpen.size(), end - kCallOpen.size()), &call)) {
      out.calls.push_back(std::move(call));
    } else {
      out.content.append(pending_, 0, raw_len);
      ++out.malformed;
    }
    pending_.erase(0, raw_len);
    state_ = State::kText;
  }
}

ToolCallDelta ToolCallParser::finish() {
  ToolCallDelta out;
  if (state_ == State::kCall) ++out.truncated;  // a call the turn never closed: dropped, markup and all
  else out.content = std::move(pending_);       // a partial "<tool_c" is plain text
  pending_.clear();
  state_ = State::kText;
  return out;
}

}  // namespace mxserve::chat
