// `mxserve eval tasks`: dataset parsing, answer extraction, the Wilson interval, and the whole command against
// a scripted OpenAI-compatible fake server (127.0.0.1 only): right, wrong, unanswerable and failing items.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "eval/tasks.h"
#include "fake_openai_server.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;
using eval::TaskKind;

fs::path temp_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("mxserve_eval_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

TEST(EvalTasks, ExtractsTheLastNumber) {
  auto x = [](const std::string& s) { return eval::extract_answer(s, TaskKind::kGsm8k, 0).value_or("none"); };
  EXPECT_EQ(x("She pays 3 * 4 = 12 dollars.\nThe answer is 1,234."), "1234");
  EXPECT_EQ(x("#### -7"), "-7");
  EXPECT_EQ(x("total 2.50"), "2.5");
  EXPECT_EQ(x("no digits here"), "none");
  EXPECT_TRUE(eval::answers_match("42", "42.0", TaskKind::kGsm8k));
  EXPECT_FALSE(eval::answers_match("41", "42", TaskKind::kGsm8k));
}

TEST(EvalTasks, ExtractsTheOptionLetter) {
  auto x = [](const std::string& s, int n = 4) { return eval::extract_answer(s, TaskKind::kMultipleChoice, n).value_or("none"); };
  EXPECT_EQ(x("The answer is (C)."), "C");
  EXPECT_EQ(x("A dog is not a cat, so the answer is B"), "B");  // the phrase beats the article "A"
  EXPECT_EQ(x("Answer: D"), "D");
  EXPECT_EQ(x("the answer is a bit long: C"), "C");  // lowercase "a" is an article, not option A
  EXPECT_EQ(x("I think D"), "D");          // "I" is outside A-D
  EXPECT_EQ(x("E is best", 4), "none");    // out of range
  EXPECT_EQ(x("nothing"), "none");
}

TEST(EvalTasks, WilsonInterval) {
  const auto a = eval::wilson_interval(8, 10);  // reference values: 0.4902, 0.9433
  EXPECT_NEAR(a.lo, 0.4902, 1e-4);
  EXPECT_NEAR(a.hi, 0.9433, 1e-4);
  const auto z = eval::wilson_interval(0, 20);
  EXPECT_NEAR(z.lo, 0.0, 1e-12);
  EXPECT_NEAR(z.hi, 0.1611, 1e-4);
  const auto all = eval::wilson_interval(50, 50);
  EXPECT_NEAR(all.lo, 0.9287, 1e-4);
  EXPECT_NEAR(all.hi, 1.0, 1e-12);
}

TEST(EvalTasks, DatasetErrorsNameTheLineAndField) {
  auto bad = temp_file("bad.jsonl", "{\"question\": \"q\", \"answer\": \"#### 4\"}\n{\"question\": 3}\n");
  auto r = eval::load_task_items(bad.string(), TaskKind::kGsm8k);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find(":2: missing string field 'question'"), std::string::npos) << r.status().to_string();
  auto mc = temp_file("mc_bad.jsonl", "{\"question\": \"q\", \"choices\": [\"x\", \"y\"], \"answer\": \"C\"}\n");
  auto m = eval::load_task_items(mc.string(), TaskKind::kMultipleChoice);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().to_string().find("'answer' must be an option letter"), std::string::npos);
  auto nonum = temp_file("nonum.jsonl", "{\"question\": \"q\", \"answer\": \"no number\"}\n");
  EXPECT_FALSE(eval::load_task_items(nonum.string(), TaskKind::kGsm8k).is_ok());
}

// The whole command: 6 gsm8k items; the fake server answers right for items whose question says "right",
// wrong for "wrong", without a number for "mute", and fails (HTTP 500) for "fail".
TEST(EvalTasks, CommandAgainstAFakeServer) {
  std::string data;
  const std::vector<std::pair<std::string, int>> items = {{"right", 12}, {"right", 7}, {"wrong", 5},
                                                          {"mute", 3}, {"fail", 9}, {"right", 1000}};
  for (size_t i = 0; i < items.size(); ++i)
    data += nlohmann::json({{"id", "q" + std::to_string(i)}, {"question", items[i].first + " " + std::to_string(items[i].second)},
                            {"answer", "work... #### " + std::to_string(items[i].second)}}).dump() + "\n";
  const auto data_path = temp_file("gsm.jsonl", data);
  bench::testing::FakeOpenAiServer server([](const bench::testing::FakeRequest& r) {
    bench::testing::FakePlan p;
    const std::string q = r.prompt.substr(0, r.prompt.find('\n'));
    const std::string n = q.substr(q.find(' ') + 1);
    if (q.rfind("fail", 0) == 0) p.status = 500;
    else if (q.rfind("right", 0) == 0) p.texts = {"Let me think. ", "3 + 4 = 7, so", " the answer is ", n, "."};
    else if (q.rfind("wrong", 0) == 0) p.texts = {"The answer is ", "4", "2."};
    else p.texts = {"I do not know."};
    return p;
  });
  ASSERT_TRUE(server.start());
  const auto out_path = fs::temp_directory_path() / ("mxserve_eval_" + std::to_string(::getpid()) + "_out.jsonl");
  const auto json_path = fs::temp_directory_path() / ("mxserve_eval_" + std::to_string(::getpid()) + "_sum.json");
  std::vector<std::string> argv_s = {"eval", "tasks", "--base-url", server.base_url() + "/v1", "--data", data_path.string(),
                                     "--task", "gsm8k", "--model", "fake", "--concurrency", "3", "--output",
                                     out_path.string(), "--json", json_path.string(), "--no-progress"};
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  EXPECT_EQ(cli::cmd_eval(static_cast<int>(argv.size()), argv.data()), 0);
  server.stop();
  EXPECT_EQ(server.requests(), 6);

  std::ifstream sum(json_path);
  const auto j = nlohmann::json::parse(sum);
  EXPECT_EQ(j["items"], 6);
  EXPECT_EQ(j["correct"], 3);
  EXPECT_EQ(j["unanswered"], 1);
  EXPECT_EQ(j["failed_requests"], 1);
  const auto ci = eval::wilson_interval(3, 6);
  EXPECT_NEAR(j["ci95"][0].get<double>(), ci.lo, 1e-12);

  std::ifstream out(out_path);
  std::string line;
  std::vector<nlohmann::json> recs;
  while (std::getline(out, line)) recs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(recs.size(), 6u);
  for (size_t i = 0; i < recs.size(); ++i) EXPECT_EQ(recs[i]["id"], "q" + std::to_string(i));  // dataset order
  EXPECT_EQ(recs[0]["correct"], true);
  EXPECT_EQ(recs[0]["response"], "Let me think. 3 + 4 = 7, so the answer is 12.");
  EXPECT_EQ(recs[2]["extracted"], "42");
  EXPECT_EQ(recs[2]["correct"], false);
  EXPECT_TRUE(recs[3]["extracted"].is_null());
  EXPECT_NE(recs[4]["error"].get<std::string>().find("HTTP 500"), std::string::npos);
  EXPECT_EQ(recs[5]["extracted"], "1000");
}

TEST(EvalTasks, MultipleChoiceAgainstAFakeServer) {
  const auto data_path = temp_file("mc.jsonl",
      "{\"question\": \"Sky?\", \"choices\": [\"green\", \"blue\", \"red\"], \"answer\": 1}\n"
      "{\"question\": \"Grass?\", \"options\": [\"green\", \"blue\"], \"answer\": \"A\"}\n");
  bench::testing::FakeOpenAiServer server([](const bench::testing::FakeRequest& r) {
    bench::testing::FakePlan p;
    p.texts = {r.prompt.find("Sky") == 0 ? "The answer is (B)." : "B"};
    return p;
  });
  ASSERT_TRUE(server.start());
  auto items = eval::load_task_items(data_path.string(), TaskKind::kMultipleChoice);
  ASSERT_TRUE(items.is_ok()) << items.status().to_string();
  EXPECT_NE((*items)[0].prompt.find("B. blue\nC. red\n"), std::string::npos);
  eval::TaskClientOptions o;
  o.base_url = server.base_url();
  o.model = "fake";
  const auto res = eval::run_task_requests(*items, o, false);
  server.stop();
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(eval::extract_answer(res[0].response, TaskKind::kMultipleChoice, 3).value_or(""), "B");
  EXPECT_EQ(eval::extract_answer(res[1].response, TaskKind::kMultipleChoice, 2).value_or(""), "B");
  EXPECT_EQ((*items)[1].reference, "A");
}

TEST(EvalTasks, UnreachableServerIsAnErrorPerItem) {
  auto items = std::vector<eval::TaskItem>{{"1", "q", "1", 0}};
  eval::TaskClientOptions o;
  o.base_url = "http://127.0.0.1:9";  // discard port: nothing listens
  o.model = "m";
  o.timeout_s = 5;
  const auto res = eval::run_task_requests(items, o, false);
  ASSERT_EQ(res.size(), 1u);
  EXPECT_FALSE(res[0].error.empty());
}

}  // namespace
}  // namespace mxserve
