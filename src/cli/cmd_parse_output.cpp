// mxserve parse-output: runs the chat output parsers (src/chat) on a file of model output text and prints
// ONE JSON object {"content", "reasoning_content", "tool_calls": [{"type","function":{"name","arguments"}}]}
// (no ids; content / reasoning_content null when empty). --chunk-size N feeds the text N bytes at a time
// through the streaming parser; the printed result must equal the one-shot one (a test checks it).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/output_parser.h"
#include "cli/args.h"
#include "cli/commands.h"

namespace mxserve::cli {
namespace {

int fail(const std::string& message) {
  const bool names_help = message.find("--help") != std::string::npos;
  std::fprintf(stderr, "error: %s%s\n", message.c_str(), names_help ? "" : " (`mxserve parse-output --help` lists the flags)");
  return 2;
}

bool read_file(const std::string& path, std::string* out) {
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    *out = ss.str();
    return true;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

int cmd_parse_output(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"--parser", "--tools", "--chunk-size", "--reasoning-parser"},
                          {"--starts-in-reasoning"});
  if (!args.is_ok()) return fail(args.status().message());
  const Args& a = *args;
  if (a.positional().size() != 1) return fail("give exactly one input FILE");
  auto parser = a.get("--parser");
  if (!parser.is_ok()) return fail("--parser is required");
  auto format = chat::parse_tool_call_format(*parser);
  if (!format.is_ok()) return fail("--parser: " + format.status().message());
  auto reasoning = chat::parse_reasoning_format(a.get_or("--reasoning-parser", "glm45"));
  if (!reasoning.is_ok()) return fail("--reasoning-parser: " + reasoning.status().message());
  auto chunk = a.get_int("--chunk-size", 0);
  if (!chunk.is_ok()) return fail(chunk.status().message());
  if (*chunk < 0 || (a.has("--chunk-size") && *chunk == 0)) return fail("--chunk-size must be a positive integer");

  chat::OutputParserConfig config;
  config.tool_calls = *format;
  config.reasoning = *reasoning;
  config.starts_in_reasoning = a.has("--starts-in-reasoning");
  auto tools = std::make_shared<chat::ToolSet>();
  if (a.has("--tools")) {
    const std::string path = a.get_or("--tools", "");
    std::string text;
    if (!read_file(path, &text)) return fail("--tools: cannot read " + path);
    auto json = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) return fail("--tools: " + path + " is not valid JSON");
    if (auto e = chat::ToolSet::from_openai(json, tools.get())) return fail("--tools " + path + ": " + e->message);
  }
  config.tools = tools;

  const std::string input_path = a.positional()[0];
  std::string text;
  if (!read_file(input_path, &text)) return fail("cannot read " + input_path);
  const chat::ParsedOutput p = chat::parse_output(config, text, static_cast<size_t>(*chunk));

  nlohmann::ordered_json out;
  out["content"] = p.content ? nlohmann::ordered_json(*p.content) : nlohmann::ordered_json(nullptr);
  out["reasoning_content"] = p.reasoning ? nlohmann::ordered_json(*p.reasoning) : nlohmann::ordered_json(nullptr);
  out["tool_calls"] = nlohmann::ordered_json::array();
  for (const auto& c : p.tool_calls)
    out["tool_calls"].push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  if (p.malformed_tool_calls > 0)
    std::fprintf(stderr, "note: %d malformed tool-call text(s) returned as content\n", p.malformed_tool_calls);
  return 0;
}

}  // namespace mxserve::cli
