// The mxserve:moe_kernel_config gauge (issue 9): one sample per MoE shape and bucket, labels as documented in
// docs/cuda.md; absent when the backend has no tuned selection (CPU backend, no MXFP4 experts).
#include <gtest/gtest.h>

#include "server/metrics.h"

namespace mxserve::server {
namespace {

TEST(MetricsMoe, KernelConfigGauge) {
  Metrics m("tiny");
  const std::string none = m.render(std::nullopt);
  EXPECT_EQ(none.find("mxserve:moe_kernel_config"), std::string::npos);
  const std::vector<kernels::MoeKernelConfigRow> rows = {
      {"E128_H4096_I1408_K8_mxfp4", "1", "gemv_r4", "gemv_r2", "table"},
      {"E160_H5120_I1536_K8_mxfp4", "any", "heuristic", "heuristic", "heuristic"}};
  const std::string out = m.render(std::nullopt, rows);
  EXPECT_NE(out.find("# TYPE mxserve:moe_kernel_config gauge"), std::string::npos) << out;
  EXPECT_NE(out.find("mxserve:moe_kernel_config{model_name=\"tiny\",shape=\"E128_H4096_I1408_K8_mxfp4\",bucket=\"1\","
                     "gate_up=\"gemv_r4\",down=\"gemv_r2\",source=\"table\"} 1"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("mxserve:moe_kernel_config{model_name=\"tiny\",shape=\"E160_H5120_I1536_K8_mxfp4\",bucket=\"any\","
                     "gate_up=\"heuristic\",down=\"heuristic\",source=\"heuristic\"} 1"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace mxserve::server
