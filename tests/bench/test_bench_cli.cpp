// CLI validation: bad input names the flag and the value.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/bench_config.h"

namespace mxserve::bench {
namespace {

Result<BenchConfig> parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  static std::string name = "bench";
  argv.push_back(name.data());
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return parse_bench_args(static_cast<int>(argv.size()), argv.data(), &help);
}

void expect_error(std::vector<std::string> args, const std::string& needle) {
  auto r = parse(args);
  ASSERT_FALSE(r.is_ok()) << needle;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(BenchCli, ErrorsNameFlagAndValue) {
  expect_error({"--request-rate", "fast", "--num-requests", "3"}, "--request-rate fast");
  expect_error({"--sweep", "1,x", "--num-requests", "3"}, "--sweep 1,x");
  expect_error({"--workload", "zipf"}, "--workload zipf");
  expect_error({"--endpoint", "embeddings"}, "--endpoint embeddings");
  expect_error({"--cache-hit-rate", "1.5", "--request-rate", "1", "--num-requests", "3"}, "--cache-hit-rate 1.5");
  expect_error({"--duration", "ten", "--request-rate", "1"}, "--duration ten");
  expect_error({"--request-rate", "1"}, "--num-requests N or --duration");
  expect_error({"--num-requests", "3"}, "--request-rate R");
  expect_error({"--bogus", "1"}, "unknown flag --bogus");
  expect_error({"--gpu-hour-price", "2", "--request-rate", "1", "--num-requests", "3"}, "--gpus");
  expect_error({"--base-url", "localhost:8000"}, "--base-url localhost:8000");
  expect_error({"--arrival", "poisson", "--burstiness", "0.5"}, "--burstiness 0.5");
  expect_error({"--max-concurrency", "0"}, "--max-concurrency 0");
}

TEST(BenchCli, DefaultsAndAliases) {
  auto r = parse({"--base-url", "http://h:1/v1/", "--random-input-len", "20000", "--output-len=1000",
                  "--sweep", "0.5,1,inf", "--num-prompts", "10", "--slo-ttft-p95", "500ms", "--burstiness", "2",
                  "--output-json", "out/r.json"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->base_url, "http://h:1");
  EXPECT_EQ(r->workload.input_len, 20000);
  EXPECT_EQ(r->workload.output_len, 1000);
  EXPECT_EQ(r->rates.size(), 3u);
  EXPECT_TRUE(std::isinf(r->rates[2]));
  EXPECT_EQ(r->num_requests, 10);
  EXPECT_DOUBLE_EQ(r->knee.slo_ttft_p95_s, 0.5);
  EXPECT_EQ(r->arrival.kind, ArrivalKind::kGamma);
  EXPECT_EQ(r->plot_prefix, "out/r");
  auto s = parse({"--workload", "single-stream"});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->workload.input_len, 10000);
  EXPECT_EQ(s->workload.output_len, 1500);
  EXPECT_EQ(s->max_concurrency, 1);
  EXPECT_EQ(s->num_requests, 5);
  auto k = parse({"--find-knee", "--duration", "60s"});
  ASSERT_TRUE(k.is_ok());
  EXPECT_EQ(k->rates, (std::vector<double>{0.5, 1, 1.5, 2, 2.25, 2.4}));
}

// --ignore-eos is honoured (on by default), --no-ignore-eos turns it off, both at once is refused.
TEST(BenchCli, IgnoreEosFlags) {
  auto d = parse({"--workload", "single-stream"});
  ASSERT_TRUE(d.is_ok());
  EXPECT_TRUE(d->ignore_eos);
  auto on = parse({"--workload", "single-stream", "--ignore-eos"});
  ASSERT_TRUE(on.is_ok());
  EXPECT_TRUE(on->ignore_eos);
  auto off = parse({"--workload", "single-stream", "--no-ignore-eos"});
  ASSERT_TRUE(off.is_ok());
  EXPECT_FALSE(off->ignore_eos);
  expect_error({"--workload", "single-stream", "--ignore-eos", "--no-ignore-eos"}, "contradict each other");
}

}  // namespace
}  // namespace mxserve::bench
