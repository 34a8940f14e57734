// The host KV tier on the CUDA backend (label gpu): the self-test's round trip -- a prompt's blocks forced out
// to pinned host memory and copied back on the side stream -- gives the target's logits, the MTP draft's
// logits and the accepted drafts bit for bit equal to a device prefix-cache hit, on both fixtures (GQA K/V;
// MLA latent + DSA indexer keys + the MTP layer's cache). MXSERVE_FIXTURE_ROOT overrides the fixtures directory.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "runtime/kv_tier_self_test.h"

namespace mxserve::runtime {
namespace {

std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return (env ? std::string(env) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures") + "/" + name;
}

class CudaKvHostTier : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaKvHostTier, RoundTripIsBitIdentical) {
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  auto lm = model::load_causal_lm(fixture_dir(GetParam()), **be, model::LoadOptions{});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  const int32_t spec_steps = (*lm)->has_mtp() ? 2 : 0;
  for (int64_t block_size : {16, 4}) {
    auto rep = run_kv_tier_self_test(make_model_executor(**lm, **be, 64, block_size), block_size, spec_steps);
    ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
    std::printf("%s block %lld: %s\n", GetParam().c_str(), static_cast<long long>(block_size), rep->summary().c_str());
    EXPECT_TRUE(rep->identical) << rep->summary();
    EXPECT_GT(rep->cached_host, 0) << rep->summary();
    if (spec_steps > 0) EXPECT_GT(rep->mtp_logit_values, 0) << rep->summary();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaKvHostTier, ::testing::Values("glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"));

}  // namespace
}  // namespace mxserve::runtime
