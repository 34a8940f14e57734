// `mxserve parse-output` as a user runs it: one JSON object {content, reasoning_content, tool_calls} (no ids),
// the same for every --chunk-size 1..16 as for the whole text, and clear exit-2 errors for an unknown
// parser name, a bad --tools schema and a bad chunk size.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace {

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr
};

CliRun run(const std::string& args) {
  CliRun r;
  FILE* p = popen((std::string(MXSERVE_BINARY) + " parse-output " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class ParseOutputCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("mxserve_parse_output_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(ParseOutputCli, JsonIsTheSameForEveryChunkSize) {
  const std::string tools = write("tools.json", R"([{"type":"function","function":{"name":"get_weather","parameters":{
      "type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}},
      {"type":"function","function":{"name":"get_time"}}])");
  const std::string glm45 = write("glm45.txt",
      "\n<think>Weather, then time.</think>\nOne moment.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Zürich</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n"
      "<tool_call>get_time\n</tool_call>");
  CliRun one = run("--parser glm45 --tools " + tools + " " + glm45);
  ASSERT_EQ(one.code, 0) << one.out;
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(one.out);
  EXPECT_EQ(j["content"], "One moment.");
  EXPECT_EQ(j["reasoning_content"], "Weather, then time.");
  ASSERT_EQ(j["tool_calls"].size(), 2u);
  EXPECT_EQ(j["tool_calls"][0], nlohmann::ordered_json::parse(
                                    R"({"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Zürich\",\"days\":2}"}})"));
  EXPECT_EQ(j["tool_calls"][1]["function"]["arguments"], "{}");
  EXPECT_FALSE(j["tool_calls"][0].contains("id"));
  for (int n = 1; n <= 16; ++n) {
    CliRun c = run("--parser glm45 --tools " + tools + " --chunk-size " + std::to_string(n) + " " + glm45);
    EXPECT_EQ(c.code, 0);
    EXPECT_EQ(c.out, one.out) << "chunk size " << n;
  }
  // GLM-4.7/5.x text that starts inside <think>; no tools file: any name, JSON-looking values parsed.
  const std::string glm47 = write("glm47.txt", "hmm</think><tool_call>lookup<arg_key>n</arg_key><arg_value>3</arg_value></tool_call>");
  CliRun g = run("--parser glm47 --starts-in-reasoning " + glm47);
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.out, R"({"content":null,"reasoning_content":"hmm","tool_calls":[{"type":"function","function":{"name":"lookup","arguments":"{\"n\":3}"}}]})"
                   "\n");
  // Plain text: no calls, an empty list.
  CliRun plain = run("--parser glm47 " + write("plain.txt", "Hello."));
  EXPECT_EQ(plain.out, "{\"content\":\"Hello.\",\"reasoning_content\":null,\"tool_calls\":[]}\n");
}

TEST_F(ParseOutputCli, BadInputIsExit2NamingTheCulprit) {
  const std::string text = write("t.txt", "x");
  CliRun a = run("--parser hermes " + text);
  EXPECT_EQ(a.code, 2);
  EXPECT_NE(a.out.find("unknown tool-call parser 'hermes'"), std::string::npos) << a.out;
  CliRun b = run("--parser glm45 --tools " + write("bad.json", R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"text"}}}}}])") + " " + text);
  EXPECT_EQ(b.code, 2);
  EXPECT_NE(b.out.find("tools[0].function.parameters.properties.x.type"), std::string::npos) << b.out;
  CliRun c = run("--parser glm45 --chunk-size 0 " + text);
  EXPECT_EQ(c.code, 2);
  CliRun d = run("--parser glm45 " + (dir_ / "missing.txt").string());
  EXPECT_EQ(d.code, 2);
  EXPECT_NE(d.out.find("missing.txt"), std::string::npos) << d.out;
}

}  // namespace
