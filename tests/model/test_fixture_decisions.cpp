// Decision-aware fixture checks (cli/fixture_decisions.h) on the CPU, where the "model under test" is the fixture
// with a planted change and the reference is the unedited fixture (both f32), judged by the bf16 format bound as a
// bf16 backend would be:
//   - identity: the fixture against itself: decisions compared on every path (batched, chunked, decode, MTP), no
//     disagreement, every check passes;
//   - near tie: the e_score_correction_bias of one expert moved just past the smallest routing margin of the
//     reference -- selection only (the routing weights use the un-biased scores), so one near-tie decision flips:
//     a legitimate flip, and every check (run under forcing) still passes;
//   - planted bugs, each failing both the plain and the decision-aware checks ("at every setting"): a wrong expert
//     bias (an expert the reference ranks far below picked for a token), the indexer keys' LayerNorm negated
//     (glm_moe_dsa), decode rows at position + 1 (an off-by-one decode position), and a batch's first two rows
//     rotated with each other's positions (a wrong RoPE row).
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
#include "planted_bug_model.h"

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

// verify-fixture on `test` (a model of the fixture at dir) in plain or decision-aware mode against `ref`.
cli::FixtureReport verify(const std::string& dir, model::CausalLM& test, backend::Backend& be, Loaded& ref, bool aware) {
  cli::FixtureOptions fo;
  fo.decision_aware = aware;
  fo.reference = ref.lm.get();
  fo.reference_backend = ref.be.get();
  auto r = cli::verify_fixture_model(dir, test, be, fo);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : cli::FixtureReport{};
}

class FixtureDecisions : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureDecisions, IdentityComparesEveryPathAndAgrees) {
  Loaded ref(fixture(GetParam())), test(fixture(GetParam()));
  const cli::FixtureReport r = verify(fixture(GetParam()), *test.lm, *test.be, ref, /*aware=*/true);
  EXPECT_GT(r.cases, 0);
  EXPECT_EQ(r.failures, 0);
  // Every path's rows: at least the batched + chunked + decode rows of every case, at every layer.
  auto cases = cli::read_fixture_cases(fixture(GetParam()), ref.lm->config().vocab_size);
  ASSERT_TRUE(cases.is_ok());
  int64_t rows = 0;
  for (const auto& c : *cases) rows += 2 * static_cast<int64_t>(c.input_ids.size()) + static_cast<int64_t>(c.greedy.size());
  EXPECT_GE(r.decision_rows, rows * ref.lm->config().n_layers / 2);
  EXPECT_EQ(r.decision_flips + r.decision_beyond_bound + r.greedy_flips + r.greedy_beyond_bound, 0);
  EXPECT_LE(r.max_bound_use, 1e-3) << "the same f32 model must use none of the bf16 bound";
  int index_sites = 0;
  for (const auto& d : reference_decisions(ref, (*cases)[0])) index_sites += d.site == model::DecisionSite::kIndexTopk;
  EXPECT_EQ(index_sites > 0, GetParam().rfind("glm_moe_dsa", 0) == 0) << "index top-k sites are observed on DSA models";
}

TEST_P(FixtureDecisions, NearTieFlipIsLegitimateAndEveryCheckStillPasses) {
  Loaded ref(fixture(GetParam()));
  auto cases = cli::read_fixture_cases(fixture(GetParam()), ref.lm->config().vocab_size);
  ASSERT_TRUE(cases.is_ok());
  // The smallest routing margin over every case: moving the bias just past it flips that decision and only
  // decisions at least as close to a tie.
  Pick p;
  for (size_t ci = 0; ci < cases->size(); ++ci) {
    const Pick q = pick_routing_row(reference_decisions(ref, (*cases)[ci]), /*want_max=*/false);
    if (q.layer >= 0 && (p.layer < 0 || q.margin < p.margin)) p = q;
  }
  ASSERT_GE(p.layer, 0);
  const double delta = 1.1 * p.margin;
  std::printf("near tie: layer %lld expert %d margin %.3g, bias += %.3g\n", static_cast<long long>(p.layer), p.expert,
              p.margin, delta);
  const std::string dir = edited_copy(GetParam(), "tie", [&](const std::string& n, std::vector<float>& v) {
    if (n == bias_name(p.layer)) v[p.expert] += static_cast<float>(delta);
  });
  Loaded test(dir);
  const cli::FixtureReport r = verify(dir, *test.lm, *test.be, ref, /*aware=*/true);
  EXPECT_GE(r.decision_flips, 1) << "the near-tie decision did not flip";
  EXPECT_EQ(r.decision_beyond_bound, 0);
  EXPECT_EQ(r.failures, 0) << "forcing the reference's decisions must give the reference's logits on every path";
  fs::remove_all(dir);
}

// A planted bug fails the plain checks and the decision-aware ones.
void expect_fails_everywhere(const std::string& what, const std::string& dir, model::CausalLM& test,
                             backend::Backend& be, Loaded& ref, bool expect_beyond_bound) {
  const cli::FixtureReport plain = verify(dir, test, be, ref, /*aware=*/false);
  const cli::FixtureReport aware = verify(dir, test, be, ref, /*aware=*/true);
  std::printf("%s: %d plain failures; decision-aware %d failures, %d decisions beyond the bound, %d greedy\n",
              what.c_str(), plain.failures, aware.failures, aware.decision_beyond_bound, aware.greedy_beyond_bound);
  EXPECT_GT(plain.failures, 0) << what << " passed the plain checks";
  EXPECT_GT(aware.failures, 0) << what << " passed the decision-aware checks";
  if (expect_beyond_bound) {
    EXPECT_GE(aware.decision_beyond_bound, 1) << what;
  }
}

TEST_P(FixtureDecisions, PlantedWrongExpertBiasFails) {
  Loaded ref(fixture(GetParam()));
  auto cases = cli::read_fixture_cases(fixture(GetParam()), ref.lm->config().vocab_size);
  ASSERT_TRUE(cases.is_ok());
  const Pick p = pick_routing_row(reference_decisions(ref, (*cases)[0]), /*want_max=*/true);
  ASSERT_GE(p.layer, 0);
  std::printf("large margin: layer %lld expert %d margin %.3g\n", static_cast<long long>(p.layer), p.expert, p.margin);
  const std::string dir = edited_copy(GetParam(), "bug", [&](const std::string& n, std::vector<float>& v) {
    if (n == bias_name(p.layer)) v[p.expert] += static_cast<float>(1.05 * p.margin);
  });
  Loaded test(dir);
  expect_fails_everywhere("wrong expert bias", dir, *test.lm, *test.be, ref, /*expect_beyond_bound=*/true);
  fs::remove_all(dir);
}

TEST_P(FixtureDecisions, PlantedOffByOneDecodePositionFails) {
  Loaded ref(fixture(GetParam())), inner(fixture(GetParam()));
  test::PlantedBugModel bugged(*inner.lm, test::PlantedBug::kDecodePositionPlusOne);
  expect_fails_everywhere("off-by-one decode position", fixture(GetParam()), bugged, *inner.be, ref, false);
}

TEST_P(FixtureDecisions, PlantedWrongRopeRowFails) {
  Loaded ref(fixture(GetParam())), inner(fixture(GetParam()));
  test::PlantedBugModel bugged(*inner.lm, test::PlantedBug::kFirstTwoRowsSwapPositions);
  expect_fails_everywhere("wrong RoPE row", fixture(GetParam()), bugged, *inner.be, ref, false);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureDecisions,
                         ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b", "glm_moe_dsa_tiny_a", "glm_moe_dsa_tiny_b"));

TEST(FixtureDecisionsDsa, PlantedNegatedIndexerKeysFail) {
  const std::string fx = "glm_moe_dsa_tiny_a";
  Loaded ref(fixture(fx));
  const std::string dir = edited_copy(fx, "indexer", [](const std::string& n, std::vector<float>& v) {
    if (n == "model.layers.0.self_attn.indexer.k_norm.weight" || n == "model.layers.0.self_attn.indexer.k_norm.bias")
      for (float& x : v) x = -x;
  });
  Loaded test(dir);
  expect_fails_everywhere("negated indexer", dir, *test.lm, *test.be, ref, /*expect_beyond_bound=*/true);
  // Judged by whole sets: no row of the negated layer's index sites may pass as a flip of a set that differs in
  // more than rounding allows. Every index-site disagreement at layer 0 must be beyond the bound.
  fs::remove_all(dir);
}

// The judgement itself, on hand-made rows (model/decisions.h judge_row).
TEST(DecisionJudgement, WholeSetAgainstTheFormatBound) {
  model::DecisionRows ref;
  ref.site = model::DecisionSite::kIndexTopk;
  ref.rows = 1;
  ref.width = 2;
  ref.ids = {0, 1};
  ref.scores = {{1.0, 0.9, 0.899, 0.1}};
  ref.sensitivity = {{1.0, 1.0, 1.0, 1.0}};
  const double u = 1e-3;  // bound per candidate 1e-3: 0.9 vs 0.899 is within 2e-3, 0.1 is not
  const int32_t same[2] = {1, 0}, near[2] = {0, 2}, far[2] = {0, 3}, both[2] = {2, 3};
  EXPECT_TRUE(model::judge_row(ref, 0, same, u).same);
  const auto n = model::judge_row(ref, 0, near, u);
  EXPECT_FALSE(n.same);
  EXPECT_TRUE(n.within_bound) << n.detail;
  EXPECT_FALSE(model::judge_row(ref, 0, far, u).within_bound);
  EXPECT_FALSE(model::judge_row(ref, 0, both, u).within_bound) << "one element within its bound does not excuse the set";
  // Grouped routing: 2 groups of 2, one group kept; the model's expert from the other group needs a group flip.
  model::DecisionRows g;
  g.site = model::DecisionSite::kExpertRouting;
  g.rows = 1;
  g.width = 1;
  g.ids = {0};
  g.n_group = 2;
  g.topk_group = 1;
  g.scores = {{0.8, 0.7, 0.79, 0.1}};  // group scores 1.5 vs 0.89
  g.sensitivity = {{1.0, 1.0, 1.0, 1.0}};
  const int32_t other_group[1] = {2};
  EXPECT_FALSE(model::judge_row(g, 0, other_group, 0.02).within_bound) << "0.61 of group margin is not rounding";
  EXPECT_TRUE(model::judge_row(g, 0, other_group, 0.2).within_bound);
}

}  // namespace
}  // namespace mxserve
