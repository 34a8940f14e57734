#include "chat/output_parser.h"

#include "chat/text_scan.h"

namespace mxserve::chat {

Result<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  if (name == "glm45") return ToolCallFormat::kGlm45;
  if (name == "glm47") return ToolCallFormat::kGlm47;
  if (name == "none") return ToolCallFormat::kNone;
  return invalid_argument("unknown tool-call parser '" + std::string(name) + "'; known: glm45 (GLM-4.5/4.6), glm47 "
                          "(GLM-4.7/5.x), none");
}

Result<ReasoningFormat> parse_reasoning_format(std::string_view name) {
  if (name == "glm45") return ReasoningFormat::kGlm45;
  if (name == "none") return ReasoningFormat::kNone;
  return invalid_argument("unknown reasoning parser '" + std::string(name) + "'; known: glm45 (<think>...</think>, "
                          "GLM-4.5 to GLM-5.x), none");
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kGlm45: return "glm45";
    case ToolCallFormat::kGlm47: return "glm47";
    case ToolCallFormat::kNone: break;
  }
  return "none";
}

const char* reasoning_format_name(ReasoningFormat f) { return f == ReasoningFormat::kGlm45 ? "glm45" : "none"; }

OutputFormats detect_output_formats(std::string_view tmpl, std::string* why) {
  OutputFormats f;
  std::string w;
  // The templates' own instructions to the model name the layout.
  if (tmpl.find("<tool_call>{function-name}\n<arg_key>") != std::string_view::npos) {
    f.tool_calls = ToolCallFormat::kGlm45;
    w = "the chat template asks for <tool_call>NAME\\n<arg_key>... (GLM-4.5/4.6 layout)";
  } else if (tmpl.find("<tool_call>{function-name}<arg_key>") != std::string_view::npos) {
    f.tool_calls = ToolCallFormat::kGlm47;
    w = "the chat template asks for <tool_call>NAME<arg_key>... (GLM-4.7/5.x layout)";
  } else {
    w = "no GLM tool-call instructions in the chat template";
  }
  if (tmpl.find("<think>") != std::string_view::npos && tmpl.find("</think>") != std::string_view::npos) {
    f.reasoning = ReasoningFormat::kGlm45;
    w += "; it renders <think>...</think> blocks";
  } else {
    w += "; no <think> blocks in the chat template";
  }
  if (why) *why = w;
  return f;
}

std::string OutputParser::EdgeTrimmer::feed(std::string_view s) {
  if (!started_) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    if (s.empty()) return {};
    started_ = true;
  }
  held_.append(s);
  size_t last = held_.size();
  while (last > 0 && is_space(held_[last - 1])) --last;
  std::string out = held_.substr(0, last);
  held_.erase(0, last);
  return out;
}

OutputParser::OutputParser(const OutputParserConfig& c) {
  if (c.reasoning != ReasoningFormat::kNone) reasoning_.emplace(c.starts_in_reasoning);
  if (c.tool_calls != ToolCallFormat::kNone) tool_calls_.emplace(c.tools);
}

void OutputParser::route_content(std::string_view content, ParsedDelta* out) {
  if (!tool_calls_) {
    out->content += content_trim_.feed(content);
    return;
  }
  ToolCallDelta d = tool_calls_->feed(content);
  out->content += content_trim_.feed(d.content);
  for (auto& c : d.calls) out->tool_calls.push_back(std::move(c));
  out->malformed_tool_calls += d.malformed;
}

ParsedDelta OutputParser::feed(std::string_view text) {
  ParsedDelta out;
  if (!reasoning_) {
    route_content(text, &out);
    return out;
  }
  ReasoningDelta r = reasoning_->feed(text);
  out.reasoning = reasoning_trim_.feed(r.reasoning);
  route_content(r.content, &out);
  return out;
}

ParsedDelta OutputParser::finish() {
  ParsedDelta out;
  if (reasoning_) {
    ReasoningDelta r = reasoning_->finish();
    out.reasoning = reasoning_trim_.feed(r.reasoning);
    route_content(r.content, &out);
  }
  if (tool_calls_) {
    ToolCallDelta d = tool_calls_->finish();
    out.content += content_trim_.feed(d.content);
    out.malformed_tool_calls += d.malformed;
    out.truncated_tool_calls += d.truncated;
  }
  return out;  // whitespace still held by the trimmers is trailing: dropped
}

ParsedOutput parse_output(const OutputParserConfig& config, std::string_view text, size_t chunk_size) {
  OutputParser p(config);
  std::string content, reasoning;
  ParsedOutput out;
  auto take = [&](ParsedDelta d) {
    content += d.content;
    reasoning += d.reasoning;
    for (auto& c : d.tool_calls) out.tool_calls.push_back(std::move(c));
    out.malformed_tool_calls += d.malformed_tool_calls;
    out.truncated_tool_calls += d.truncated_tool_calls;
  };
  if (chunk_size == 0) chunk_size = text.size() + 1;
  for (size_t i = 0; i < text.size(); i += chunk_size) take(p.feed(text.substr(i, chunk_size)));
  take(p.finish());
  if (!content.empty()) out.content = std::move(content);
  if (!reasoning.empty()) out.reasoning = std::move(reasoning);
  return out;
}

}  // namespace mxserve::chat
