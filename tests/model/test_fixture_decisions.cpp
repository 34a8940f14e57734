// Decision-aware fixture checks (cli/fixture_decisions.h) on the CPU, where the "model under test" is the fixture
// with one weight edited and the reference is the unedited fixture (both f32):
//   - identity: the fixture against itself: every routing / index site compared, no disagreement, forced run exact;
//   - near tie: the e_score_correction_bias of one expert moved just past the smallest routing margin of the
//     reference -- selection only (the routing weights use the un-biased scores), so one near-tie decision flips:
//     it must be classified as a legitimate flip, and the forced run must equal the reference;
//   - a real bug: the same edit sized past the LARGEST margin (an expert the reference ranks far below picked for a
//     token): must fail as beyond the bound;
//   - an indexer bug (glm_moe_dsa): the indexer keys' LayerNorm negated on one full layer: index top-k decisions
//     change against large reference margins and must fail.
// glm4_moe (routing only) and glm_moe_dsa (routing + index top-k).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "cli/fixture.h"
#include "cli/fixture_decisions.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/causal_lm.h"
#include "model/decisions.h"
#include "runtime/sequence_runner.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + name; }

// A copy of fixture `fx` whose f32 / bf16 tensors pass through edit(name, values) (stored back as f32).
std::string edited_copy(const std::string& fx, const std::string& tag,
                        const std::function<void(const std::string&, std::vector<float>&)>& edit) {
  const fs::path dst = fs::temp_directory_path() / ("mxserve_decisions_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const char* f : {"config.json", "generation_config.json", "reference.safetensors"})
    if (fs::exists(fs::path(fixture(fx)) / f)) fs::copy_file(fs::path(fixture(fx)) / f, dst / f);
  auto src = io::SafetensorsFile::open(fixture(fx) + "/model.safetensors");
  EXPECT_TRUE(src.is_ok());
  io::NamedTensors out;
  for (const auto& info : (*src)->tensors()) {
    const Tensor view = (*src)->view(info);
    Tensor t = Tensor::empty(DType::kF32, info.shape);
    std::vector<float> v(view.numel());
    for (int64_t i = 0; i < view.numel(); ++i) {
      if (info.dtype == DType::kF32) {
        v[i] = view.data<float>()[i];
      } else {
        const uint32_t bits = static_cast<uint32_t>(view.data<uint16_t>()[i]) << 16;
        std::memcpy(&v[i], &bits, 4);
      }
    }
    edit(info.name, v);
    std::memcpy(t.raw(), v.data(), v.size() * 4);
    out.emplace_back(info.name, std::move(t));
  }
  EXPECT_TRUE(io::write_safetensors((dst / "model.safetensors").string(), out).is_ok());
  return dst.string();
}

struct Loaded {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<model::CausalLM> lm;
  explicit Loaded(const std::string& dir) {
    auto m = model::load_causal_lm(dir, *be, model::LoadOptions{});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (m.is_ok()) lm = std::move(*m);
  }
};

// The reference's routing decisions on case 0 (teacher-forced over input_ids + greedy, as the checker runs it).
std::vector<model::DecisionRows> reference_decisions(Loaded& ref, const cli::FixtureCase& c) {
  std::vector<int32_t> seq = c.input_ids;
  seq.insert(seq.end(), c.greedy.begin(), c.greedy.end() - 1);
  runtime::SequenceRunner runner(*ref.lm, *ref.be, 64, 16);
  model::DecisionRecorder rec;
  runtime::SequenceState st;
  {
    model::ScopedDecisionHook scope(&rec);
    EXPECT_TRUE(runner.extend({&st}, {seq}, true, false).is_ok());
  }
  return rec.records;
}

struct Pick {
  int64_t layer = -1;
  int32_t expert = -1;  // the reference's best dropped expert of the row
  double margin = 0;
};

// The routing row with the smallest (want_max: largest) finite expert-level margin.
Pick pick_routing_row(const std::vector<model::DecisionRows>& recs, bool want_max) {
  Pick p;
  for (const auto& d : recs) {
    if (d.site != model::DecisionSite::kExpertRouting) continue;
    for (int64_t r = 0; r < d.rows; ++r) {
      if (!std::isfinite(d.margin[r]) || d.margin_pair[r].second < 0 || d.margin[r] <= 1e-6) continue;
      if (p.layer < 0 || (want_max ? d.margin[r] > p.margin : d.margin[r] < p.margin))
        p = {d.layer, d.margin_pair[r].second, d.margin[r]};
    }
  }
  return p;
}

std::string bias_name(int64_t layer) { return "model.layers." + std::to_string(layer) + ".mlp.gate.e_score_correction_bias"; }

cli::CaseDecisions check(const std::string& test_dir, Loaded& ref, const cli::FixtureCase& c, double rel_error) {
  Loaded test(test_dir);
  cli::DecisionCheckOptions o;
  o.rel_error = rel_error;
  auto r = cli::check_case_decisions(*test.lm, *test.be, *ref.lm, *ref.be, c, o, stdout);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : cli::CaseDecisions{};
}

class FixtureDecisions : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureDecisions, IdentityComparesEverySiteAndAgrees) {
  Loaded ref(fixture(GetParam()));
  auto cases = cli::read_fixture_cases(fixture(GetParam()), ref.lm->config().vocab_size);
  ASSERT_TRUE(cases.is_ok());
  const cli::CaseDecisions d = check(fixture(GetParam()), ref, (*cases)[0], cli::kBf16DecisionRelError);
  EXPECT_GT(d.sites, 0);
  EXPECT_EQ(d.flips + d.beyond_bound + d.greedy_flips + d.greedy_beyond_bound + d.unforced_disagreements, 0);
  EXPECT_LE(d.forced_rel_l2, 1e-4);
  EXPECT_TRUE(d.ok());
  int index_sites = 0;
  for (const auto& r : reference_decisions(ref, (*cases)[0])) index_sites += r.site == model::DecisionSite::kIndexTopk;
  EXPECT_EQ(index_sites > 0, GetParam().rfind("glm_moe_dsa", 0) == 0) << "index top-k sites are observed on DSA models";
}

TEST_P(FixtureDecisions, NearTieFlipIsLegitimateAndTheForcedRunMatches) {
  Loaded ref(fixture(GetParam()));
  auto cases = cli::read_fixture_cases(fixture(GetParam()), ref.lm->config().vocab_size);
  ASSERT_TRUE(cases.is_ok());
  // The smallest routing margin over every case: moving the bias just past it flips that decision and only
  // decisions at least as close to a tie.
  Pick p;
  size_t at = 0;
  for (size_t ci = 0; ci < cases->size(); ++ci) {
    const Pick q = pick_routing_row(reference_decisions(ref, (*cases)[ci]), /*want_max=*/false);
    if (q.layer >= 0 && (p.layer < 0 || q.margin < p.margin)) p = q, at = ci;
  }
  ASSERT_GE(p.layer, 0);
  const double delta = 1.1 * p.margin;
  std::printf("near tie: case %zu layer %lld expert %d margin %.3g, bias += %.3g\n", at, static_cast<long long>(p.layer),
              p.expert, p.margin, delta);
  const std::string dir = edited_copy(GetParam(), "tie", [&](const std::string& n, std::vector<float>& v) {
    if (n == bias_name(p.layer)) v[p.expert] += static_cast<float>(delta);
  });
  const cli::CaseDecisions d = check(dir, ref, (*cases)[at], cli::kBf16DecisionRelError);
  EXPECT_GE(d.flips, 1) << "the near-tie decision did not flip";
  EXPECT_EQ(d.beyond_bound, 0);
  EXPECT_GE(d.unforced_disagreements, 1);
  EXPECT_LE(d.forced_rel_l2, 1e-5) << "forcing the reference's decisions must give the reference's logits";
  EXPECT_TRUE(d.ok());
  // Through verify-fixture, every case: decision-aware, any plain check the flip breaks is explained (on the DSA
  // fixtures only: suite time).
  if (GetParam().rfind("glm_moe_dsa", 0) != 0) return fs::remove_all(dir), void();
  Loaded test(dir);
  cli::FixtureOptions fo;
  auto plain = cli::verify_fixture_model(dir, *test.lm, *test.be, fo);
  fo.decision_aware = true;
  fo.reference = ref.lm.get();
  fo.reference_backend = ref.be.get();
  auto aware = cli::verify_fixture_model(dir, *test.lm, *test.be, fo);
  ASSERT_TRUE(plain.is_ok() && aware.is_ok());
  std::printf("verify-fixture: %d plain failures, %d decision-aware\n", plain->failures, aware->failures);
  EXPECT_EQ(aware->failures, 0);
  fs::remove_all(dir);
}

TEST_P(FixtureDecisions, WrongExpertForALargeMarginTokenFails) {
  Loaded ref(fixture(GetParam()));
  auto cases = cli::read_fixture_cases(fixture(GetParam()), ref.lm->config().vocab_size);
  ASSERT_TRUE(cases.is_ok());
  const Pick p = pick_routing_row(reference_decisions(ref, (*cases)[0]), /*want_max=*/true);
  ASSERT_GE(p.layer, 0);
  std::printf("large margin: layer %lld expert %d margin %.3g\n", static_cast<long long>(p.layer), p.expert, p.margin);
  const std::string dir = edited_copy(GetParam(), "bug", [&](const std::string& n, std::vector<float>& v) {
    if (n == bias_name(p.layer)) v[p.expert] += static_cast<float>(1.05 * p.margin);
  });
  const cli::CaseDecisions d = check(dir, ref, (*cases)[0], cli::kBf16DecisionRelError);
  EXPECT_GE(d.beyond_bound, 1) << "a wrong expert against a large reference margin must fail";
  EXPECT_FALSE(d.ok());
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureDecisions,
                         ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b", "glm_moe_dsa_tiny_a", "glm_moe_dsa_tiny_b"));

TEST(FixtureDecisionsDsa, NegatedIndexerKeysFailAtTheIndexSites) {
  const std::string fx = "glm_moe_dsa_tiny_a";
  Loaded ref(fixture(fx));
  auto cases = cli::read_fixture_cases(fixture(fx), ref.lm->config().vocab_size);
  ASSERT_TRUE(cases.is_ok());
  const cli::FixtureCase& longest = *std::max_element(cases->begin(), cases->end(), [](const auto& a, const auto& b) {
    return a.input_ids.size() < b.input_ids.size();
  });
  const std::string dir = edited_copy(fx, "indexer", [](const std::string& n, std::vector<float>& v) {
    if (n == "model.layers.0.self_attn.indexer.k_norm.weight" || n == "model.layers.0.self_attn.indexer.k_norm.bias")
      for (float& x : v) x = -x;
  });
  const cli::CaseDecisions d = check(dir, ref, longest, cli::kBf16DecisionRelError);
  EXPECT_GE(d.beyond_bound, 1) << "index top-k decisions against large margins must fail";
  EXPECT_FALSE(d.ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mxserve
