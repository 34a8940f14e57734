// `mxserve bench judge`: saved per-request records read back equal the records written (the metrics and
// the queue trend computed from them match), and the command judges a saved run's points by the knee rule,
// naming what is missing when it cannot.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/knee.h"
#include "bench/metrics.h"
#include "bench/rejudge.h"
#include "bench/report.h"

namespace mxserve::bench {
namespace {

// One request every 1 / rate seconds, each living e2e_s(i) (first token after 0.5 s, 11 tokens).
std::vector<RequestRecord> run_at(double rate, int n, double (*e2e_s)(int)) {
  std::vector<RequestRecord> rs;
  for (int i = 0; i < n; ++i) {
    RequestRecord r;
    r.index = i;
    r.scheduled_s = r.sent_s = i / rate;
    r.first_token_s = r.sent_s + 0.5;
    r.last_token_s = r.end_s = r.sent_s + e2e_s(i);
    r.token_chunks = r.output_tokens = 11;
    r.prompt_tokens = 100;
    r.ok = true;
    rs.push_back(r);
  }
  return rs;
}
double steady(int) { return 5.0; }
double piling_up(int i) { return 5.0 + 0.5 * i; }  // offered 2 req/s, served 1: the queue grows

nlohmann::json point(double rate, const std::vector<RequestRecord>& rs) {
  return {{"offered_rate", rate}, {"max_concurrency", 0}, {"requests", requests_to_json(rs)}};
}

std::string write_run(const std::string& name, const nlohmann::json& run) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << run.dump();
  return path;
}

int judge_file(const std::vector<std::string>& args, std::string* out) {
  std::vector<std::string> argv_s = {"judge"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int rc = cmd_bench_judge(static_cast<int>(argv.size()), argv.data());
  *out = testing::internal::GetCapturedStdout() + testing::internal::GetCapturedStderr();
  return rc;
}

TEST(Rejudge, SavedRecordsReadBackGiveTheSameMetrics) {
  std::vector<RequestRecord> rs = run_at(1.0, 40, piling_up);
  rs[3].ok = false, rs[3].first_token_s = rs[3].last_token_s = -1, rs[3].error = "http 503: busy";
  rs[7].warmup = true;
  auto back = records_from_json(requests_to_json(rs));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  const RateMetrics a = compute_rate_metrics(rs, 1.0, 0), b = compute_rate_metrics(*back, 1.0, 0);
  EXPECT_EQ(a.completed, b.completed);
  EXPECT_EQ(a.failed, b.failed);
  EXPECT_EQ(a.warmup, b.warmup);
  EXPECT_NEAR(a.ttft.p95, b.ttft.p95, 1e-9);
  EXPECT_NEAR(a.e2e.p50, b.e2e.p50, 1e-9);
  EXPECT_NEAR(a.tpot.mean, b.tpot.mean, 1e-9);
  EXPECT_EQ(a.inflight.window_requests, b.inflight.window_requests);
  EXPECT_NEAR(a.inflight.growth_per_s, b.inflight.growth_per_s, 1e-9);
  EXPECT_EQ(judge(a, KneeCriteria{}).reason, judge(b, KneeCriteria{}).reason);
}

TEST(Rejudge, JudgesEachPointAndFindsTheKnee) {
  const nlohmann::json run = {{"points", {point(2.0, run_at(2.0, 60, piling_up)), point(1.0, run_at(1.0, 40, steady))}}};
  const std::string path = write_run("mxserve_rejudge_run.json", run);
  std::string out;
  ASSERT_EQ(judge_file({path}, &out), 0) << out;
  EXPECT_NE(out.find("| 1 | 40 | 0.50 / 0.50 | 100.0% | 5.0 -> 5.0"), std::string::npos) << out;
  EXPECT_NE(out.find("requests in flight"), std::string::npos) << out;  // the 2 req/s point's queue grows
  EXPECT_NE(out.find("stationary queue; rates ascending): 1 req/s"), std::string::npos) << out;
  ASSERT_EQ(judge_file({path, "--slo-ttft-p95", "400ms"}, &out), 0) << out;  // a TTFT target below 0.5 s
  EXPECT_NE(out.find("knee: below the lowest rate judged (1 req/s)"), std::string::npos) << out;
  std::remove(path.c_str());
}

TEST(Rejudge, NamesWhatAFileLacks) {
  std::string out;
  const std::string no_records = write_run("mxserve_rejudge_bare.json", {{"points", {{{"offered_rate", 1.0}}}}});
  EXPECT_EQ(judge_file({no_records}, &out), 2);
  EXPECT_NE(out.find("points[0] has no per-request records: rerun the bench with --save-requests"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("| offered"), std::string::npos) << "no table for a file that cannot be judged: " << out;
  nlohmann::json bad = point(1.0, run_at(1.0, 4, steady));
  bad["requests"][2].erase("end_s");
  const std::string bad_record = write_run("mxserve_rejudge_bad.json", {{"points", {bad}}});
  EXPECT_EQ(judge_file({bad_record}, &out), 2);
  EXPECT_NE(out.find("points[0].requests[2]: no \"end_s\""), std::string::npos) << out;
  EXPECT_EQ(judge_file({"/nonexistent/run.json"}, &out), 2);
  EXPECT_NE(out.find("/nonexistent/run.json: cannot be read"), std::string::npos) << out;
  EXPECT_EQ(judge_file({no_records, "--min-success", "2"}, &out), 2);
  EXPECT_NE(out.find("--min-success 2: must be in [0, 1]"), std::string::npos) << out;
  std::remove(no_records.c_str());
  std::remove(bad_record.c_str());
}

}  // namespace
}  // namespace mxserve::bench
