// ChatTemplate: a parsed Jinja chat template (tokenizer_config.json "chat_template" or a
// chat_template.jinja file) rendered natively. Rendering matches @huggingface/jinja (what
// transformers.js uses) byte for byte on the supported subset; a construct outside the subset is
// an Unsupported error naming it and its line -- never a silently different prompt.
// Thread-safe: render() is const and keeps no state between calls.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::tokenizer {

namespace jinja {
struct Node;
}

// Template inputs are ordered_json: key order is part of the rendered prompt (tool schemas go
// through tojson), so request bodies must be parsed with nlohmann::ordered_json to keep the
// client's order, as Python dicts do. A plain nlohmann::json (sorted keys) is accepted too.
using OrderedJson = nlohmann::ordered_json;

// What a chat request supplies to a template.
struct ChatInputs {
  OrderedJson messages = OrderedJson::array();
  OrderedJson tools;                 // null when absent (templates test `if tools`)
  bool add_generation_prompt = false;
  OrderedJson kwargs = OrderedJson::object();  // extra template variables (enable_thinking, ...)
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> parse(std::string_view source);
  // Renders with `context` as the template's variables (a JSON object).
  Result<std::string> render(const OrderedJson& context) const;
  Result<std::string> render(const nlohmann::json& context) const;
  // Builds the context transformers.js passes (messages, add_generation_prompt, tools,
  // documents=null, the special tokens named in tokenizer_config.json, then kwargs) and renders.
  Result<std::string> render_chat(const ChatInputs& inputs, const nlohmann::json& tokenizer_config) const;

  static OrderedJson make_context(const ChatInputs& inputs, const nlohmann::json& tokenizer_config);

 private:
  std::shared_ptr<const jinja::Node> program_;
};

}  // namespace mxserve::tokenizer
