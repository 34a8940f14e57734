// ChatTemplate (see chat_template.h).
#include "tokenizer/chat_template.h"

#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {

using nlohmann::json;

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  MX_ASSIGN_OR_RETURN(auto tokens, jinja::tokenize(source));
  MX_ASSIGN_OR_RETURN(jinja::NodePtr program, jinja::parse(tokens));
  ChatTemplate t;
  t.program_ = std::shared_ptr<const jinja::Node>(std::move(program));
  return t;
}

Result<std::string> ChatTemplate::render(const json& context) const {
  try {
    return render(OrderedJson::parse(context.dump()));
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("chat template context is not valid JSON text: ") + e.what());
  }
}

Result<std::string> ChatTemplate::render(const OrderedJson& context) const {
  if (!program_) return invalid_argument("chat template was not parsed");
  if (!context.is_object()) return invalid_argument("chat template context must be a JSON object");
  try {
    jinja::Env globals;
    jinja::install_globals(globals);
    for (auto it = context.begin(); it != context.end(); ++it) globals.set(it.key(), jinja::from_json(it.value()));
    jinja::Interpreter interp;
    return interp.render(*program_, globals);
  } catch (const jinja::RenderError& e) {
    return invalid_argument("chat template error" + (e.line > 0 ? " at line " + std::to_string(e.line) : std::string()) +
                            ": " + e.message);
  } catch (const std::exception& e) {
    return internal_error(std::string("chat template render failed: ") + e.what());
  }
}

OrderedJson ChatTemplate::make_context(const ChatInputs& in, const json& config) {
  OrderedJson ctx = OrderedJson::object();
  ctx["messages"] = in.messages;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  static const char* kSpecial[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
  if (config.is_object()) {
    for (const char* key : kSpecial) {
      if (!config.contains(key)) continue;
      const json& v = config[key];
      if (v.is_string() && !v.get<std::string>().empty()) ctx[key] = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) ctx[key] = v["content"].get<std::string>();
    }
  }
  if (in.kwargs.is_object())
    for (auto it = in.kwargs.begin(); it != in.kwargs.end(); ++it) ctx[it.key()] = it.value();
  return ctx;
}

Result<std::string> ChatTemplate::render_chat(const ChatInputs& inputs, const json& config) const {
  try {
    return render(make_context(inputs, config));
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("malformed chat inputs: ") + e.what());
  }
}

}  // namespace mxserve::tokenizer
