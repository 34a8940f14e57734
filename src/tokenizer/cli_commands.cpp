// Tokenizer CLI subcommands (see cli_commands.h).
#include "tokenizer/cli_commands.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::tokenizer {

namespace {

struct Args {
  std::map<std::string, std::string> values;
  std::map<std::string, bool> flags;
  std::string error;
};

// Parses --key VALUE options (names in `with_value`) and --flag switches (names in `switches`).
Args parse_args(int argc, char** argv, std::initializer_list<const char*> with_value,
                std::initializer_list<const char*> switches) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    bool known = false;
    for (const char* v : with_value) {
      if (k == v) {
        if (i + 1 >= argc) {
          a.error = "missing value after " + k;
          return a;
        }
        a.values[k] = argv[++i];
        known = true;
      }
    }
    for (const char* s : switches) {
      if (k == s) {
        a.flags[k] = true;
        known = true;
      }
    }
    if (!known) {
      a.error = "unknown argument '" + k + "'";
      return a;
    }
  }
  return a;
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

// --tokenizer names a tokenizer.json or the directory holding it (with tokenizer_config.json: added tokens).
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path) {
  if (std::filesystem::is_directory(path)) return Tokenizer::load_dir(path);
  return Tokenizer::load(path);
}

// --tokenizer-config names a tokenizer_config.json or the directory holding it.
std::string config_file(const std::string& path) {
  return std::filesystem::is_directory(path) ? (std::filesystem::path(path) / "tokenizer_config.json").string() : path;
}

int usage(const char* cmd, const std::string& why, const char* text) {
  std::fprintf(stderr, "mxserve %s: %s\nusage: mxserve %s %s\n", cmd, why.c_str(), cmd, text);
  return 2;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  const char* kUsage = "--tokenizer DIR|PATH/tokenizer.json [--no-special]  (UTF-8 lines on stdin)";
  Args a = parse_args(argc, argv, {"--tokenizer"}, {"--no-special"});
  if (!a.error.empty()) return usage("tokenize", a.error, kUsage);
  if (!a.values.count("--tokenizer")) return usage("tokenize", "--tokenizer is required", kUsage);
  auto tok = load_tokenizer(a.values["--tokenizer"]);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "mxserve tokenize: %s\n", tok.status().to_string().c_str());
    return 2;
  }
  bool add_special = !a.flags.count("--no-special");
  int rc = 0;
  std::string line;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    auto ids = (*tok)->encode(line, add_special);
    if (!ids.is_ok()) {
      std::fprintf(stderr, "mxserve tokenize: line %zu: %s\n", line_no, ids.status().to_string().c_str());
      std::cout << nlohmann::json{{"error", ids.status().message()}}.dump(-1, ' ', false,
                                                                            nlohmann::json::error_handler_t::replace)
                << '\n';
      rc = 1;
      continue;
    }
    std::cout << nlohmann::json(*ids).dump() << '\n';
  }
  return rc;
}

int cmd_detokenize(int argc, char** argv) {
  const char* kUsage = "--tokenizer DIR|PATH/tokenizer.json [--skip-special] [--json]  (JSON id arrays on stdin)";
  Args a = parse_args(argc, argv, {"--tokenizer"}, {"--skip-special", "--json"});
  if (!a.error.empty()) return usage("detokenize", a.error, kUsage);
  if (!a.values.count("--tokenizer")) return usage("detokenize", "--tokenizer is required", kUsage);
  auto tok = load_tokenizer(a.values["--tokenizer"]);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "mxserve detokenize: %s\n", tok.status().to_string().c_str());
    return 2;
  }
  int rc = 0;
  std::string line;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    std::vector<int32_t> ids;
    bool ok = j.is_array();
    for (const auto& x : j.is_array() ? j : nlohmann::json::array()) {
      if (!x.is_number_integer() || x.get<int64_t>() < INT32_MIN || x.get<int64_t>() > INT32_MAX) {
        ok = false;
        break;
      }
      ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    if (!ok) {
      std::fprintf(stderr, "mxserve detokenize: line %zu: expected a JSON array of integer ids\n", line_no);
      std::cout << '\n';
      rc = 1;
      continue;
    }
    std::string text = (*tok)->decode(ids, a.flags.count("--skip-special") > 0);
    if (a.flags.count("--json")) std::cout << nlohmann::json(text).dump() << '\n';
    else std::cout << text << '\n';
  }
  return rc;
}

int cmd_render_chat(int argc, char** argv) {
  const char* kUsage =
      "(--tokenizer-config PATH/tokenizer_config.json | --template FILE.jinja) --messages FILE.json "
      "[--tools FILE.json] [--add-generation-prompt] [--kwargs JSON]";
  Args a = parse_args(argc, argv, {"--tokenizer-config", "--template", "--messages", "--tools", "--kwargs"},
                      {"--add-generation-prompt"});
  if (!a.error.empty()) return usage("render-chat", a.error, kUsage);
  if (!a.values.count("--messages")) return usage("render-chat", "--messages is required", kUsage);
  if (!a.values.count("--tokenizer-config") && !a.values.count("--template"))
    return usage("render-chat", "--tokenizer-config or --template is required", kUsage);

  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "mxserve render-chat: %s\n", m.c_str());
    return 2;
  };
  nlohmann::json config = nlohmann::json::object();
  std::string source, text;
  if (a.values.count("--tokenizer-config")) {
    const std::string p = config_file(a.values["--tokenizer-config"]);
    if (!read_file(p, text)) return fail("cannot read '" + p + "'");
    config = nlohmann::json::parse(text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) return fail("'" + p + "' is not a JSON object");
    if (config.contains("chat_template") && config["chat_template"].is_string())
      source = config["chat_template"].get<std::string>();
    auto sibling = std::filesystem::path(p).parent_path() / "chat_template.jinja";
    if (source.empty() && std::filesystem::exists(sibling) && !read_file(sibling.string(), source))
      return fail("cannot read '" + sibling.string() + "'");
  }
  if (a.values.count("--template") && !read_file(a.values["--template"], source))
    return fail("cannot read '" + a.values["--template"] + "'");
  if (source.empty()) return fail("no chat template (tokenizer_config.json has none; pass --template)");

  auto tmpl = ChatTemplate::parse(source);
  if (!tmpl.is_ok()) return fail(tmpl.status().to_string());

  ChatInputs in;
  auto load_json = [&](const std::string& flag, OrderedJson& out) -> bool {
    std::string body;
    if (!read_file(a.values[flag], body)) return false;
    out = OrderedJson::parse(body, nullptr, false);
    return !out.is_discarded();
  };
  if (!load_json("--messages", in.messages) || !in.messages.is_array())
    return fail("--messages must name a file holding a JSON array of messages");
  if (a.values.count("--tools") && !load_json("--tools", in.tools))
    return fail("--tools must name a file holding JSON");
  if (a.values.count("--kwargs")) {
    in.kwargs = OrderedJson::parse(a.values["--kwargs"], nullptr, false);
    if (in.kwargs.is_discarded() || !in.kwargs.is_object()) return fail("--kwargs must be a JSON object");
  }
  in.add_generation_prompt = a.flags.count("--add-generation-prompt") > 0;
  auto out = tmpl->render_chat(in, config);
  if (!out.is_ok()) {
    std::fprintf(stderr, "mxserve render-chat: %s\n", out.status().to_string().c_str());
    return 1;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}

}  // namespace mxserve::tokenizer
