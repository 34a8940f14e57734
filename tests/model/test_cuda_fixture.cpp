// verify-fixture on the CUDA backend for every golden fixture (label gpu): batched and chunked-cache
// teacher-forced logits, greedy decode through the paged cache, MTP logits, all against HF transformers.
// Tolerance kBf16RelL2 = 2e-2 relative L2 on the logits: the reference is fp32 arithmetic on bf16
// weights, while the CUDA backend rounds every activation to bf16 (~2^-9 relative per rounding, a few
// dozen roundings compounded through 3-4 layers); docs/cuda.md gives the measured figures. Greedy tokens
// must match exactly. Skips with a clear message where no CUDA device is present.
// MXSERVE_FIXTURE_ROOT overrides the fixtures directory (the GPU machine runs from a copied tree).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/backend.h"
#include "cli/fixture.h"

namespace mxserve {
namespace {

constexpr double kBf16RelL2 = 2e-2;

std::string fixture_root() {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return env ? std::string(env) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures";
}

class CudaFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFixture, VerifyFixture) {
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  cli::FixtureOptions opt;
  opt.max_rel_l2 = kBf16RelL2;
  auto report = cli::verify_fixture(fixture_root() + "/" + GetParam(), **be, opt);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_GT(report->cases, 0);
  EXPECT_EQ(report->failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixture, ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b"));

}  // namespace
}  // namespace mxserve
