// Chat-template conformance: mxserve's renderer == @huggingface/jinja (run by node now) for the
// Qwen3, DeepSeek-V3 and Llama-3 templates (npm tokenizer_config.json) and the GLM-4.5-Air,
// GLM-4.7-Flash and GLM-5.1 chat_template.jinja files, over every case x variant in
// tests/data/tokenizer/chat_cases.json. Where the reference raises an error, mxserve must too.
#include <filesystem>
#include <set>

#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace mxserve::tokenizer {
namespace {

using nlohmann::json;
using testing::node_modules;
using testing::read_text;
using testing::require_node_modules;
using testing::run_command;
using testing::source_dir;
using testing::split_lines;

struct TemplateSource {
  std::string name, template_path, config_path;  // "-" when not used
};

std::vector<TemplateSource> template_sources() {
  std::vector<TemplateSource> out;
  for (const char* pkg : {"qwen3", "deepseek_v3", "llama3"})
    out.push_back({pkg, "-", testing::tokenizer_config_path(pkg)});
  for (const char* m : {"GLM-4.5-Air", "GLM-4.7-Flash", "GLM-5.1"})
    out.push_back({m, source_dir() + "/tests/data/tokenizer/templates/" + m + ".jinja", "-"});
  return out;
}

class TemplateConformance : public ::testing::TestWithParam<size_t> {};

TEST_P(TemplateConformance, RenderMatchesHuggingFaceJinja) {
  if (!require_node_modules()) return;
  const TemplateSource src = template_sources()[GetParam()];
  const std::string cases_path = source_dir() + "/tests/data/tokenizer/chat_cases.json";
  OrderedJson suite = OrderedJson::parse(read_text(cases_path));
  json config = src.config_path == "-" ? json::object() : json::parse(read_text(src.config_path));
  std::string source = src.template_path == "-" ? config["chat_template"].get<std::string>() : read_text(src.template_path);
  auto tmpl = ChatTemplate::parse(source);
  ASSERT_TRUE(tmpl.is_ok()) << src.name << ": " << tmpl.status().to_string();

  std::vector<std::string> expected = split_lines(run_command("node " + source_dir() + "/tools/tokenizer/render_ref.mjs " +
                                                              node_modules() + " " + src.template_path + " " +
                                                              src.config_path + " " + cases_path));
  ASSERT_EQ(expected.size(), suite["cases"].size() * suite["variants"].size());
  size_t k = 0, rendered = 0, both_error = 0;
  for (const OrderedJson& c : suite["cases"]) {
    for (const OrderedJson& v : suite["variants"]) {
      json want = json::parse(expected[k++]);
      ChatInputs in;
      in.messages = c["messages"];
      in.tools = c.contains("tools") ? c["tools"] : OrderedJson();
      in.add_generation_prompt = v["add_generation_prompt"].get<bool>();
      in.kwargs = v.contains("kwargs") ? v["kwargs"] : OrderedJson::object();
      auto got = tmpl->render_chat(in, config);
      std::string where = src.name + " case '" + c["name"].get<std::string>() + "' variant " + v.dump();
      if (!want["ok"].get<bool>()) {
        EXPECT_FALSE(got.is_ok()) << where << ": reference failed (" << want["error"] << ") but mxserve rendered:\n"
                                  << (got.is_ok() ? *got : "");
        ++both_error;
        continue;
      }
      ASSERT_TRUE(got.is_ok()) << where << ": " << got.status().to_string();
      EXPECT_EQ(*got, want["out"].get<std::string>()) << where;
      ++rendered;
    }
  }
  std::printf("[templates] %s: %zu renders equal, %zu errors on both sides\n", src.name.c_str(), rendered, both_error);
}

INSTANTIATE_TEST_SUITE_P(Templates, TemplateConformance, ::testing::Range<size_t>(0, 6),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           std::string n = template_sources()[i.param].name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Every chat template committed under tests/data/tokenizer/templates (verbatim copies of the published
// model files, README.md there) parses, and each is one the render test above compares: a new template
// file cannot be added without being checked against the reference renderer.
TEST(TemplateConformance, CommittedTemplatesParseAndAreAllCompared) {
  const std::filesystem::path dir = source_dir() + "/tests/data/tokenizer/templates";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir << " is missing from the checkout";
  std::set<std::string> compared;
  for (const auto& src : template_sources())
    if (src.template_path != "-") compared.insert(std::filesystem::path(src.template_path).filename().string());
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".jinja") continue;
    auto t = ChatTemplate::parse(read_text(e.path().string()));
    EXPECT_TRUE(t.is_ok()) << e.path() << ": " << t.status().to_string();
    EXPECT_TRUE(compared.count(e.path().filename().string())) << e.path() << " is not in template_sources()";
    ++n;
  }
  EXPECT_EQ(n, compared.size()) << "a template named in template_sources() is missing from " << dir;
}

}  // namespace
}  // namespace mxserve::tokenizer
