#include "test_tokenizer_files.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

namespace mxserve::server::testing {
namespace {

// GPT-2's printable stand-ins for the 256 byte values.
std::vector<std::string> byte_alphabet() {
  std::vector<int> cps(256, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cps[b] = printable ? b : 256 + extra++;
  }
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const int cp = cps[b];
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out[b] = s;
  }
  return out;
}

}  // namespace

void write_test_tokenizer(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const auto alpha = byte_alphabet();
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[alpha[b]] = b;
  const std::string sp = alpha[' '];
  // Merges over the byte alphabet; each result becomes a token.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"h", "e"}, {"i", "n"}, {"e", "r"}, {"a", "n"}, {sp, "t"}, {sp, "a"}, {"o", "n"}, {"r", "e"},
      {sp + "t", "h"}, {sp + "th", "e"}, {"e", "d"}, {"in", "g"}, {sp, "s"}, {sp, "w"}, {"o", "u"}, {"l", "l"},
      {sp, "o"}, {"i", "s"}, {sp, "i"}, {"e", "n"}, {"a", "t"}, {sp, "c"}, {"o", "r"}, {"e", "s"}, {sp, "b"},
      {sp, "h"}, {"l", "e"}, {"i", "t"}, {sp, "m"}, {sp, "f"}, {"a", "r"}, {sp, "d"}, {sp, "p"}, {"s", "t"}};
  int next = 259;
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (const auto& [a, b] : merges) {
    merge_list.push_back(a + " " + b);
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  auto special = [](int id, const std::string& content) {
    return nlohmann::ordered_json{{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
                                  {"rstrip", false},   {"normalized", false}, {"special", true}};
  };
  nlohmann::ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                       {"use_regex", true}};
  nlohmann::ordered_json tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = {special(256, "<|endoftext|>"), special(257, "<|im_start|>"), special(258, "<|im_end|>")};
  tok["normalizer"] = nullptr;
  tok["pre_tokenizer"] = byte_level;
  tok["post_processor"] = byte_level;
  tok["decoder"] = byte_level;
  tok["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                  {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false},
                  {"ignore_merges", false}, {"vocab", vocab}, {"merges", merge_list}};
  std::ofstream(dir + "/tokenizer.json") << tok.dump();

  const std::string tmpl =
      "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}"
      "{%- endfor %}{{ '<|im_end|>\\n' }}{%- endif %}"
      "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
      "{%- if message['content'] is string %}{{ message['content'] }}{%- endif %}{{ '<|im_end|>\\n' }}{%- endfor %}"
      "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";
  nlohmann::ordered_json cfg;
  cfg["chat_template"] = tmpl;
  cfg["eos_token"] = "<|im_end|>";
  cfg["bos_token"] = nullptr;
  std::ofstream(dir + "/tokenizer_config.json") << cfg.dump();
}

}  // namespace mxserve::server::testing
