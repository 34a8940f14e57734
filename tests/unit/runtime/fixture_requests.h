// The committed fixtures (tests/fixtures/<name>) for the engine tests that run real tiny models: each
// loaded once per process on the CPU backend with its cases, and the cases' prompts as greedy requests
// (ignore_eos, so every request runs its full length).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"

namespace mxserve::runtime::testing {

struct LoadedFixture {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<model::CausalLM> lm;
  std::vector<cli::FixtureCase> cases;
};

inline LoadedFixture& load_fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<LoadedFixture>> cache;
  auto& slot = cache[name];
  if (!slot) {
    slot = std::make_unique<LoadedFixture>();
    const std::string dir = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + name;
    auto m = model::load_causal_lm(dir, *slot->be, model::LoadOptions{});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    slot->lm = std::move(*m);
    auto cases = cli::read_fixture_cases(dir, slot->lm->config().vocab_size);
    EXPECT_TRUE(cases.is_ok());
    slot->cases = std::move(*cases);
  }
  return *slot;
}

// One greedy request of max_tokens per case, in case order.
inline std::vector<RequestSpec> greedy_fixture_requests(const std::vector<cli::FixtureCase>& cases,
                                                        int32_t max_tokens) {
  std::vector<RequestSpec> specs;
  for (const auto& c : cases) {
    RequestSpec r;
    r.prompt = c.input_ids;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    specs.push_back(r);
  }
  return specs;
}

}  // namespace mxserve::runtime::testing
