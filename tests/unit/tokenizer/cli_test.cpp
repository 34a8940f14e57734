// CLI hooks: tokenize / detokenize / render-chat through the test-only dispatcher binary.
#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace mxserve::tokenizer {
namespace {

std::string cli() { return MXSERVE_TOKENIZER_CLI; }

std::string write_temp(const std::string& name, const std::string& body) {
  auto p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p, std::ios::binary) << body;
  return p.string();
}

TEST(Cli, TokenizeDetokenizeRoundTrip) {
  if (!testing::require_node_modules()) return;
  std::string tj = testing::tokenizer_json_path("qwen3");
  std::string in = write_temp("mx_cli_in.txt", "Hello world<|im_end|>\n日本語 123\n");
  std::string ids = testing::run_command(cli() + " tokenize --tokenizer " + tj + " < " + in);
  EXPECT_EQ(ids, "[9707,1879,151645]\n[101059,102819,220,16,17,18]\n");
  std::string ids_file = write_temp("mx_cli_ids.txt", ids);
  std::string text = testing::run_command(cli() + " detokenize --tokenizer " + tj + " < " + ids_file);
  EXPECT_EQ(text, "Hello world<|im_end|>\n日本語 123\n");
  std::string skipped = testing::run_command(cli() + " detokenize --skip-special --json --tokenizer " + tj + " < " + ids_file);
  EXPECT_EQ(skipped, "\"Hello world\"\n\"日本語 123\"\n");
}

TEST(Cli, TokenizeReportsBadLinesAndKeepsAlignment) {
  if (!testing::require_node_modules()) return;
  std::string in = write_temp("mx_cli_bad.txt", "ok\n\xFF\xFE\nok\n");
  std::string cmd = cli() + " tokenize --tokenizer " + testing::tokenizer_json_path("qwen3") + " < " + in + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  EXPECT_NE(rc, 0);
  auto lines = testing::split_lines(out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "[562]");
  EXPECT_NE(lines[1].find("UTF-8"), std::string::npos);
  EXPECT_EQ(lines[2], "[562]");
}

TEST(Cli, RenderChatMatchesTemplate) {
  if (!testing::require_node_modules()) return;
  std::string msgs = write_temp("mx_cli_msgs.json", R"([{"role": "user", "content": "Hi"}])");
  std::string out = testing::run_command(cli() + " render-chat --tokenizer-config " + testing::tokenizer_config_path("qwen3") +
                                         " --messages " + msgs + " --add-generation-prompt --kwargs '{\"enable_thinking\": false}'");
  EXPECT_EQ(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  std::string glm = testing::run_command(cli() + " render-chat --template " + testing::source_dir() +
                                         "/tests/data/tokenizer/templates/GLM-5.1.jinja --messages " + msgs +
                                         " --add-generation-prompt");
  EXPECT_EQ(glm, "[gMASK]<sop><|user|>Hi<|assistant|><think>");
  int rc = std::system((cli() + " render-chat --messages " + msgs + " 2>/dev/null").c_str());
  EXPECT_NE(rc, 0);
  // A lone surrogate in request JSON is rejected cleanly.
  std::string lone = write_temp("mx_cli_lone.json", R"([{"role": "user", "content": "bad \ud800 here"}])");
  rc = std::system((cli() + " render-chat --tokenizer-config " + testing::tokenizer_config_path("qwen3") + " --messages " +
                    lone + " 2>/dev/null").c_str());
  EXPECT_NE(rc, 0);
}

}  // namespace
}  // namespace mxserve::tokenizer
