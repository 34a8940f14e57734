// OutputParser: one assistant turn's text -> content, reasoning_content and tool calls, incrementally.
// Pipeline: ReasoningParser (think block) -> ToolCallParser (on the content part only, so a <tool_call>
// inside <think> stays reasoning) -> edge trimming of content and reasoning (leading whitespace dropped,
// trailing whitespace held until more text follows it; the GLM templates strip both when they render a
// turn back). One-shot parsing is streaming with one chunk (parse_output), so both give the same result
// for every chunking. Also: parser names (sglang's) and their detection from a chat template.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/reasoning_parser.h"
#include "chat/tool_call_parser.h"
#include "core/status.h"

namespace mxserve::chat {

enum class ReasoningFormat { kNone, kGlm45 };

// The server-wide choice (flags or detection).
struct OutputFormats {
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  ReasoningFormat reasoning = ReasoningFormat::kNone;
};

// "glm45" | "glm47" | "none" (errors list the accepted names).
Result<ToolCallFormat> parse_tool_call_format(std::string_view name);
Result<ReasoningFormat> parse_reasoning_format(std::string_view name);
const char* tool_call_format_name(ToolCallFormat f);
const char* reasoning_format_name(ReasoningFormat f);

// Formats implied by a chat template's source; `why` says what was recognised (for the start-up log).
OutputFormats detect_output_formats(std::string_view chat_template, std::string* why);

// One request's parsing plan.
struct OutputParserConfig {
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  bool starts_in_reasoning = false;                      // prompt_opens_reasoning(rendered prompt)
  ToolCallFormat tool_calls = ToolCallFormat::kNone;     // kNone: tool-call text stays content
  std::shared_ptr<const ToolSet> tools;
};

struct ParsedDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  int malformed_tool_calls = 0;
  int truncated_tool_calls = 0;  // calls cut by the end of the turn (dropped; tool_call_parser.h)
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  explicit OutputParser(const OutputParserConfig& config);
  ParsedDelta feed(std::string_view text);
  ParsedDelta finish();  // once, at the end of the turn

 private:
  // Drops leading whitespace; holds trailing whitespace until non-space text follows it.
  class EdgeTrimmer {
   public:
    std::string feed(std::string_view s);
   private:
    bool started_ = false;
    std::string held_;
  };
  void route_content(std::string_view content, ParsedDelta* out);

  std::optional<ReasoningParser> reasoning_;
  std::optional<ToolCallParser> tool_calls_;
  EdgeTrimmer content_trim_, reasoning_trim_;
};

// The whole turn: content / reasoning are nullopt when empty. chunk_size > 0 feeds that many bytes at a time.
struct ParsedOutput {
  std::optional<std::string> content;
  std::optional<std::string> reasoning;
  std::vector<ToolCall> tool_calls;
  int malformed_tool_calls = 0;
  int truncated_tool_calls = 0;
};
ParsedOutput parse_output(const OutputParserConfig& config, std::string_view text, size_t chunk_size = 0);

}  // namespace mxserve::chat
