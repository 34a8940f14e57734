// Benchmark mode (--speculative-simulate-acceptance): refused unless explicitly enabled, and when enabled every
// generation response carries x-mxserve-simulated-acceptance: true and /metrics reports the simulated rate,
// so benchmark output can never pass for real output. A normal server marks nothing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server_fixture.h"

namespace mxserve::server::testing {
namespace {

runtime::SpecConfig simulated(double a) {
  runtime::SpecConfig spec;
  spec.num_steps = 2;
  spec.adaptive = false;
  spec.self_test = false;
  spec.simulate_acceptance = a;
  return spec;
}

TEST(ServerBenchmarkMode, SimulatedAcceptanceIsRefusedWithoutBenchmarkMode) {
  ServingConfig sc;
  sc.model_path = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";
  sc.spec = simulated(2.0);
  auto model = ServingModel::load(sc);
  ASSERT_FALSE(model.is_ok());
  EXPECT_NE(model.status().to_string().find("allowed only with --benchmark-mode"), std::string::npos)
      << model.status().to_string();
}

TEST(ServerBenchmarkMode, ResponsesAndMetricsAreMarked) {
  TestServerOptions o;
  o.spec = simulated(2.5);
  o.benchmark_mode = true;
  TestServer s(o);
  auto r = s.post("/v1/completions", R"({"prompt":"x","max_tokens":6,"ignore_eos":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.headers.count("x-mxserve-simulated-acceptance"), 1u);
  EXPECT_EQ(r.headers.at("x-mxserve-simulated-acceptance"), "true");
  // A streamed response (read whole here, headers included) is marked too.
  auto st = http_request("POST", s.url("/v1/completions"), R"({"prompt":"x","max_tokens":4,"ignore_eos":true,"stream":true})",
                         {"Content-Type: application/json", "Authorization: Bearer test-key"});
  EXPECT_EQ(st.status, 200) << st.body;
  EXPECT_NE(st.body.find("data: [DONE]"), std::string::npos) << st.body;
  EXPECT_EQ(st.headers.count("x-mxserve-simulated-acceptance"), 1u) << "streamed responses are marked too";
  EXPECT_DOUBLE_EQ(s.metric("mxserve:spec_decode_simulated_acceptance"), 2.5);
}

TEST(ServerBenchmarkMode, NormalServerIsNotMarked) {
  TestServer s;
  auto r = s.post("/v1/completions", R"({"prompt":"x","max_tokens":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers.count("x-mxserve-simulated-acceptance"), 0u);
  EXPECT_EQ(s.metric("mxserve:spec_decode_simulated_acceptance"), 0);
}

}  // namespace
}  // namespace mxserve::server::testing
