// The CUDA parallel layouts on ONE GPU through the shared-device stand-in (issue 32 item 2; every rank its own
// CUDA backend and stream on device 0): tp 2 / 4, tp x ep (2 / 4), dp 2 (plain and + DP attention, + EP),
// tp 2 x dp 2 + DP attention (+ EP 4) on glm4_moe_tiny_a and glm_moe_dsa_tiny_a, each against one rank:
//   - the fixture checker (cli::verify_fixture_model) in decision-aware mode, the CPU reference's routing /
//     index decisions forced, logits within the bf16 bound (rel L2 <= 2e-2 as dev/gpu/standin.sh), greedy
//     tokens judged by the format bound: 0 failed checks;
//   - an engine with four concurrent requests (both DP groups busy), chunked prefill, a second wave reusing
//     the prefixes and a small pool that preempts: greedy tokens equal to the one-rank CUDA engine's;
//   - MTP chain and tree speculation with several ranks (tp 2; dp 2 + DP attention): the one-rank tokens;
//   - the fused all-reduce + add + RMSNorm in the forward (the default at tp > 1 on CUDA; on the stand-in the
//     event-ordered collective: one kernel per rank reading every rank's input in place, no device spin barrier)
//     at tp 2, tp 4 and tp 2 x dp 2 + DP attention (*_tiny_b: tp 2 + ep 2), each against its own unfused run
//     (LaunchConfig::disable_custom_all_reduce): the fixture checks (decision-aware, both fixtures), and for
//     glm4_moe_tiny_a the logits of the first prompt within rel L2 2e-2 of the unfused logits and greedy tokens equal
//     to the unfused run's (glm_moe_dsa_tiny_a's near-tie decisions may flip: printed, judged by the fixture checks),
//     under a hang guard (a timeout fails the test naming
//     the layout instead of hanging).
//   - CUDA graphs at tp 2 / tp 4 (MXSERVE_TP_GRAPHS=1: every rank's decode step captured into one graph on rank
//     0's stream, launch/lockstep_model.h), fused and unfused: greedy tokens of the fixture's prompts identical
//     with graphs on and off and decode steps replayed (cli::verify_fixture_graphs); under DP (plain dp 2, dp 2 +
//     DP attention, tp 2 x dp 2 + DP attention (+ EP 4); every DP group padded to the bucket): the same with
//     requests on both DP groups, MTP chain / tree verify steps replayed with identical tokens, MXSERVE_TP_GRAPHS=0
//     replaying nothing.
// Every launch here runs the fused path unless it says otherwise (it is the default).
// Label gpu; skips without a CUDA device. MXSERVE_FIXTURE_ROOT overrides the fixtures directory.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "cli/fixture_graphs.h"
#include "launch/launch.h"
#include "model/causal_lm.h"
#include "model/decisions.h"
#include "kvcache/kv_cache.h"
#include "runtime/engine.h"

namespace mxserve::launch {
namespace {

// MXSERVE_FIXTURE_ROOT overrides the fixtures directory (the GPU machine runs from a copied tree).
const std::string kFixtures = [] {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return env != nullptr ? std::string(env) + "/" : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/";
}();

struct Layout {
  int tp = 1, dp = 1;
  bool dp_attention = false;
  int ep = 1;
  std::string name() const {
    return "tp " + std::to_string(tp) + " x dp " + std::to_string(dp) + (dp_attention ? " + dp attention" : "") +
           (ep > 1 ? " + ep " + std::to_string(ep) : "");
  }
};

std::vector<Layout> layouts() {
  return {{2, 1},       {4, 1},       {2, 1, false, 2},    {4, 1, false, 4}, {1, 2},
          {1, 2, true}, {1, 2, true, 2}, {2, 2, true},     {2, 2, true, 4},  {2, 2, false, 2}};
}

enum class Fused { kDefault, kOff };

Result<std::unique_ptr<LaunchedModel>> launch(const std::string& dir, const Layout& l, bool mtp,
                                              Fused fused = Fused::kDefault) {
  LaunchConfig lc;
  lc.disable_custom_all_reduce = fused == Fused::kOff;
  lc.model.path = dir;
  lc.model.load_mtp = mtp;
  lc.backend = "cuda";
  lc.communicator = l.tp * l.dp > 1 ? "shared-device" : "";
  lc.parallel.tp = l.tp;
  lc.parallel.dp = l.dp;
  lc.parallel.dp_attention = l.dp_attention;
  lc.parallel.ep = l.ep;
  lc.cpu_group.timeout = std::chrono::seconds(60);
  return launch_model(lc);
}

class CudaParallelLayouts : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = backend::make_backend("cuda");
    if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  }
};

TEST_F(CudaParallelLayouts, FixtureChecksMatchTheReference) {
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"}) {
    const std::string dir = kFixtures + f;
    auto ref_be = backend::make_cpu_backend();
    auto ref = model::load_causal_lm(dir, *ref_be, model::LoadOptions{});
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    for (const Layout& l : layouts()) {
      auto lm = launch(dir, l, /*mtp=*/true);
      ASSERT_TRUE(lm.is_ok()) << f << " " << l.name() << ": " << lm.status().to_string();
      cli::FixtureOptions opt;
      opt.max_rel_l2 = 2e-2;
      opt.decision_aware = true;
      opt.unit_roundoff = model::kBf16UnitRoundoff;
      opt.reference = ref->get();
      opt.reference_backend = ref_be.get();
      auto report = cli::verify_fixture_model(dir, (*lm)->model(), (*lm)->backend(), opt);
      ASSERT_TRUE(report.is_ok()) << f << " " << l.name() << ": " << report.status().to_string();
      EXPECT_GT(report->cases, 0);
      EXPECT_EQ(report->failures, 0) << f << " " << l.name();
      std::printf("PASS-CHECK %s %s: %d cases, %d failed checks\n", f, l.name().c_str(), report->cases,
                  report->failures);
    }
  }
}

// Greedy tokens of four concurrent requests, then a second wave sharing their prefixes.
std::vector<std::vector<int32_t>> run_engine(LaunchedModel& lm, const std::vector<std::vector<int32_t>>& prompts,
                                             int64_t n_blocks, const runtime::SpecConfig& spec = {},
                                             int64_t* preemptions = nullptr) {
  runtime::EngineConfig ec;
  ec.spec = spec;
  ec.scheduler.block_size = 4;
  ec.scheduler.chunked_prefill_size = 5;
  ec.scheduler.max_num_batched_tokens = 12;
  ec.n_blocks = n_blocks;
  ec.max_model_len = 64;
  auto engine = lm.make_engine(ec);
  std::vector<std::vector<int32_t>> tokens(2 * prompts.size());
  for (int wave = 0; wave < 2; ++wave) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      runtime::RequestSpec req;
      req.prompt = prompts[i];
      if (wave == 1) req.prompt.back() = prompts[(i + 1) % prompts.size()][0];
      req.sampling.temperature = 0;
      req.sampling.max_tokens = 6;
      req.sampling.ignore_eos = true;
      auto* out = &tokens[wave * prompts.size() + i];
      EXPECT_TRUE(engine->submit(req, [out](const runtime::TokenEvent& ev) {
        if (ev.token >= 0) out->push_back(ev.token);
      }).is_ok());
    }
    while (!engine->idle()) {
      engine->step();
      const Status inv = engine->check_invariants();
      EXPECT_TRUE(inv.is_ok()) << inv.to_string();
      if (!inv.is_ok()) return tokens;
    }
  }
  if (preemptions != nullptr) *preemptions = engine->stats().scheduler.preemptions;
  return tokens;
}

std::vector<std::vector<int32_t>> prompts_for(LaunchedModel& one, const std::string& dir) {
  auto cases = cli::read_fixture_cases(dir, one.config().vocab_size);
  EXPECT_TRUE(cases.is_ok());
  std::vector<int32_t> base = cases->front().input_ids;
  while (base.size() < 24) base.insert(base.end(), base.begin(), base.end());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p(base.begin() + i, base.begin() + i + 13 + i);
    p[0] = static_cast<int32_t>((p[0] + 7 * i) % one.config().vocab_size);
    prompts.push_back(p);
  }
  return prompts;
}

// Fixtures whose greedy tokens must equal one rank's at every layout: no decision of theirs sits within bf16 noise of
// its boundary on these prompts. glm_moe_dsa_tiny_a does not qualify (measured on an H100, 2026-12-06: every layout
// that sums partials over ranks takes another token at the second step; verify-fixture's decision-aware checks
// find 14 index / routing flips at tp 2, all within the format bound).
bool exact_across_ranks(const std::string& fixture) { return fixture == "glm4_moe_tiny_a"; }
TEST_F(CudaParallelLayouts, EngineGreedyTokensEqualOneRank) {
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"}) {
    const std::string dir = kFixtures + f;
    auto one = launch(dir, {}, false);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    const auto prompts = prompts_for(**one, dir);
    const auto want = run_engine(**one, prompts, 64);
    ASSERT_EQ(want[0].size(), 6u);
    for (const Layout& l : layouts()) {
      auto lm = launch(dir, l, false);
      ASSERT_TRUE(lm.is_ok()) << f << " " << l.name() << ": " << lm.status().to_string();
      // The layout's own tokens: one rank's where the model has no near-tie decisions (glm4_moe_tiny_a), else
      // its first run's. glm_moe_dsa_tiny_a (random weights, top-6 keys) flips index / routing decisions within
      // the bf16 bound once o_proj / the MoE sum partials over ranks (FixtureChecksMatchTheReference judges those
      // flips decision by decision); chunked prefill, prefix reuse and preemption must still change nothing.
      const auto own = run_engine(**lm, prompts, 64);
      const auto& expect = exact_across_ranks(f) ? want : own;
      if (exact_across_ranks(f)) EXPECT_EQ(own, want) << f << " " << l.name();
      int64_t preempted = 0;
      EXPECT_EQ(run_engine(**lm, prompts, 16, {}, &preempted), expect) << f << " " << l.name() << " (small pool)";
      EXPECT_GT(preempted, 0) << f << " " << l.name() << ": the small pool should preempt";
      std::printf("PASS-ENGINE %s %s\n", f, l.name().c_str());
    }
  }
}

TEST_F(CudaParallelLayouts, MtpChainAndTreeWithSeveralRanks) {
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"}) {
    const std::string dir = kFixtures + f;
    auto one = launch(dir, {}, false);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    const auto prompts = prompts_for(**one, dir);
    const auto want = run_engine(**one, prompts, 64);
    runtime::SpecConfig chain;
    chain.num_steps = 2;
    chain.adaptive = false;
    chain.self_test = false;
    runtime::SpecConfig tree = chain;
    tree.topk = 2;
    tree.num_draft_tokens = 5;
    for (const Layout& l : {Layout{2, 1}, Layout{1, 2, true}, Layout{2, 2, true, 4}}) {
      auto lm = launch(dir, l, true);
      ASSERT_TRUE(lm.is_ok()) << f << " " << l.name() << ": " << lm.status().to_string();
      // Speculation is lossless against the layout's own plain decoding (see EngineGreedyTokensEqualOneRank).
      const auto plain = exact_across_ranks(f) ? want : run_engine(**lm, prompts, 64);
      EXPECT_EQ(run_engine(**lm, prompts, 64, chain), plain) << f << " " << l.name() << " chain MTP";
      EXPECT_EQ(run_engine(**lm, prompts, 64, tree), plain) << f << " " << l.name() << " tree MTP";
      std::printf("PASS-MTP %s %s\n", f, l.name().c_str());
    }
  }
}

// Hang guard: a forward that never returns (ranks waiting on each other on the device) ends the process with a
// message naming what hung, instead of hanging the suite. ctest sees the failure exit.
class HangGuard {
 public:
  HangGuard(std::string what, std::chrono::seconds limit) : what_(std::move(what)) {
    thread_ = std::thread([this, limit] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
        std::fprintf(stderr, "FAIL: timeout: %s did not finish within %lld s (a rank waits for another on the "
                             "device: the fused all-reduce or a collective hung)\n",
                     what_.c_str(), static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  ~HangGuard() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// The last row's logits of one prefill forward over `ids` (blocks 0.. of a fresh cache), on the host.
Tensor prompt_logits(LaunchedModel& lm, const std::vector<int32_t>& ids) {
  const int32_t n = static_cast<int32_t>(ids.size()), bs = 16;
  model::ForwardBatch b;
  b.token_ids = ids;
  for (int32_t i = 0; i < n; ++i) b.positions.push_back(i);
  b.logit_rows = {n - 1};
  model::SequenceSpan span;
  span.n_tokens = n;
  span.kv_len = n;
  for (int32_t j = 0; j * bs < n; ++j) span.block_table.push_back(j);
  b.seqs.push_back(span);
  kvcache::KvCache kv(lm.model().kv_spec(8, bs), [&](DType dt, Shape s) { return lm.backend().alloc(dt, s); });
  auto out = lm.model().forward(b, kv);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? lm.backend().to_host(out->logits) : Tensor();
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = a.data<float>()[i] - b.data<float>()[i];
    num += d * d;
    den += static_cast<double>(b.data<float>()[i]) * b.data<float>()[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

TEST_F(CudaParallelLayouts, FusedAllReduceMatchesItsUnfusedRun) {
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a", "glm4_moe_tiny_b", "glm_moe_dsa_tiny_b"}) {
    const std::string dir = kFixtures + f;
    // The *_tiny_b fixtures split only with whole experts (moe_intermediate_size 24: a 12-wide slice is refused).
    const bool tiny_b = std::string(f).find("tiny_b") != std::string::npos;
    const std::vector<Layout> fused_layouts =
        tiny_b ? std::vector<Layout>{Layout{2, 1, false, 2}} : std::vector<Layout>{Layout{2, 1}, Layout{4, 1}, Layout{2, 2, true}};
    auto ref_be = backend::make_cpu_backend();
    auto ref = model::load_causal_lm(dir, *ref_be, model::LoadOptions{});
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    auto one = launch(dir, {}, false);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    const auto prompts = prompts_for(**one, dir);
    for (const Layout& l : fused_layouts) {
      HangGuard guard(std::string(f) + " " + l.name() + " fused vs unfused", std::chrono::seconds(600));
      auto unfused = launch(dir, l, /*mtp=*/false, Fused::kOff);
      ASSERT_TRUE(unfused.is_ok()) << f << " " << l.name() << ": " << unfused.status().to_string();
      const auto want = run_engine(**unfused, prompts, 64);
      const Tensor want_logits = prompt_logits(**unfused, prompts[0]);
      unfused->reset();  // frees the unfused ranks before the fused launch (one GPU)
      auto lm = launch(dir, l, /*mtp=*/true);  // the default: fused
      ASSERT_TRUE(lm.is_ok()) << f << " " << l.name() << ": " << lm.status().to_string();
      cli::FixtureOptions opt;
      opt.max_rel_l2 = 2e-2;
      opt.decision_aware = true;
      opt.unit_roundoff = model::kBf16UnitRoundoff;
      opt.reference = ref->get();
      opt.reference_backend = ref_be.get();
      auto report = cli::verify_fixture_model(dir, (*lm)->model(), (*lm)->backend(), opt);
      ASSERT_TRUE(report.is_ok()) << f << " " << l.name() << " fused: " << report.status().to_string();
      EXPECT_EQ(report->failures, 0) << f << " " << l.name() << " fused";
      // The fused residual is rounded once from the f32 sum (unfused: the sum, then the add): bf16 rounding apart.
      const Tensor got_logits = prompt_logits(**lm, prompts[0]);
      ASSERT_EQ(got_logits.numel(), want_logits.numel());
      const double err = rel_l2(got_logits, want_logits);
      // glm_moe_dsa_tiny_a's near-tie index / routing decisions may flip on a rounding difference, moving unforced
      // logits past any rounding bound: its fused logits are judged decision by decision by the fixture checks.
      if (exact_across_ranks(f)) EXPECT_LE(err, 2e-2) << f << " " << l.name() << ": fused logits vs unfused";
      const auto got = run_engine(**lm, prompts, 64);
      if (exact_across_ranks(f)) EXPECT_EQ(got, want) << f << " " << l.name() << " fused vs unfused tokens";
      std::printf("PASS-FUSED %s %s: logits rel L2 %.2e vs unfused, tokens %s\n", f, l.name().c_str(), err,
                  got == want ? "equal" : "differ (near-tie fixture; judged by the fixture checks)");
    }
  }
}

TEST_F(CudaParallelLayouts, CudaGraphsAtTpAboveOneMatchEager) {
  setenv("MXSERVE_TP_GRAPHS", "1", 1);
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"}) {
    const std::string dir = kFixtures + f;
    for (const Layout& l : {Layout{2, 1}, Layout{4, 1}}) {
      for (Fused fused : {Fused::kDefault, Fused::kOff}) {
        const std::string what = std::string(f) + " " + l.name() + (fused == Fused::kOff ? " unfused" : " fused");
        HangGuard guard(what + " graphs on vs off", std::chrono::seconds(600));
        auto lm = launch(dir, l, /*mtp=*/false, fused);  // no MTP layer: MTP graphs stay one-rank (eager here)
        ASSERT_TRUE(lm.is_ok()) << what << ": " << lm.status().to_string();
        auto g = cli::verify_fixture_graphs(dir, (*lm)->model(), (*lm)->backend(), /*block_size=*/4);
        ASSERT_TRUE(g.is_ok()) << what << ": " << g.status().to_string();
        EXPECT_EQ(g->failures, 0) << what << ": graphs on vs off";
        EXPECT_GT(g->replays, 0) << what << ": no decode step replayed (were the graphs refused? see the log)";
        std::printf("PASS-GRAPHS %s: %lld decode steps replayed, tokens identical to eager\n", what.c_str(),
                    static_cast<long long>(g->replays));
      }
    }
  }
  unsetenv("MXSERVE_TP_GRAPHS");
}

// Greedy tokens of an engine over lm (its DP ranks), CUDA graphs on or off, and the steps replayed.
struct GraphRun {
  std::vector<std::vector<int32_t>> tokens;
  runtime::ModelExecutor::GraphReplayCounts counts;
  int64_t replays = 0;
};
GraphRun run_graph_engine(LaunchedModel& lm, const std::vector<std::vector<int32_t>>& prompts, bool graphs,
                          const runtime::SpecConfig& spec = {}) {
  runtime::EngineConfig ec;
  ec.spec = spec;
  ec.cuda_graphs = graphs;
  ec.scheduler.block_size = 4;
  ec.scheduler.dp_ranks = lm.layout().dp;
  ec.scheduler.max_running = static_cast<int64_t>(prompts.size());
  ec.n_blocks = 96;
  ec.max_model_len = 64;
  auto ex = lm.make_executor(ec.n_blocks, ec.scheduler.block_size);
  runtime::ModelExecutor* raw = ex.get();
  runtime::Engine engine(ec, std::move(ex));
  GraphRun run;
  run.tokens.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    runtime::RequestSpec req;
    req.prompt = prompts[i];
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 12;
    req.sampling.ignore_eos = true;
    auto* out = &run.tokens[i];
    EXPECT_TRUE(engine.submit(req, [out](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) out->push_back(ev.token);
    }).is_ok());
  }
  while (!engine.idle()) {
    engine.step();
    const Status inv = engine.check_invariants();
    EXPECT_TRUE(inv.is_ok()) << inv.to_string();
    if (!inv.is_ok()) break;
  }
  run.counts = raw->graph_replay_counts();
  run.replays = raw->graph_replays();
  return run;
}

// CUDA graphs under DP (runtime/dp_graph_rows.h, launch/dp_graph_step.h): plain dp 2, dp 2 + DP attention,
// tp 2 x dp 2 + DP attention (+ EP 4, the seed layout's shape), every DP group padded to the bucket in one joined
// graph. The fixture's prompts with requests on both DP groups (verify_fixture_graphs with the layout's DP
// ranks): greedy tokens identical with graphs on and off, decode steps replayed. With DP attention, four prompts
// with MTP chain and tree speculation (the verify steps' graphs; the MTP draft steps stay eager under several
// ranks): tokens identical, verify steps replayed; MXSERVE_TP_GRAPHS=0: nothing replayed.
TEST_F(CudaParallelLayouts, CudaGraphsUnderDpMatchEager) {
  unsetenv("MXSERVE_TP_GRAPHS");  // on by default
  runtime::SpecConfig chain;
  chain.num_steps = 2;
  chain.adaptive = false;
  chain.self_test = false;
  runtime::SpecConfig tree = chain;
  tree.topk = 2;
  tree.num_draft_tokens = 5;
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"}) {
    const std::string dir = kFixtures + f;
    for (const Layout& l : {Layout{1, 2}, Layout{1, 2, true}, Layout{2, 2, true}, Layout{2, 2, true, 4}}) {
      const std::string what = std::string(f) + " " + l.name();
      HangGuard guard(what + " DP graphs on vs off", std::chrono::seconds(600));
      {
        auto lm = launch(dir, l, /*mtp=*/false);
        ASSERT_TRUE(lm.is_ok()) << what << ": " << lm.status().to_string();
        auto g = cli::verify_fixture_graphs(dir, (*lm)->model(), (*lm)->backend(), /*block_size=*/4,
                                            /*mtp_draft_graphs=*/false, l.dp);
        ASSERT_TRUE(g.is_ok()) << what << ": " << g.status().to_string();
        EXPECT_EQ(g->failures, 0) << what << ": graphs on vs off";
        EXPECT_GT(g->replays, 0) << what << ": no decode step replayed (were the DP graphs refused? see the log)";
        std::printf("PASS-DPGRAPHS %s: %lld decode steps replayed, tokens identical to eager\n", what.c_str(),
                    static_cast<long long>(g->replays));
      }
      if (!l.dp_attention) continue;  // MTP with several CUDA ranks: the DP-attention layouts (as MtpChainAndTree...)
      auto lm = launch(dir, l, /*mtp=*/true);
      ASSERT_TRUE(lm.is_ok()) << what << ": " << lm.status().to_string();
      const auto prompts = prompts_for(**lm, dir);
      const GraphRun eager = run_graph_engine(**lm, prompts, false, chain);
      const GraphRun graphs = run_graph_engine(**lm, prompts, true, chain);
      EXPECT_EQ(eager.replays, 0) << what;
      EXPECT_EQ(graphs.tokens, eager.tokens) << what << " + MTP chain: graphs on vs off";
      EXPECT_GT(graphs.counts.verify, 0) << what << " + MTP chain: no verify step replayed";
      const GraphRun tree_eager = run_graph_engine(**lm, prompts, false, tree);
      const GraphRun tree_graphs = run_graph_engine(**lm, prompts, true, tree);
      EXPECT_EQ(tree_graphs.tokens, tree_eager.tokens) << what << " + MTP tree: graphs on vs off";
      EXPECT_GT(tree_graphs.counts.tree_verify, 0) << what << " + MTP tree: no tree verify step replayed";
      std::printf("PASS-DPGRAPHS-MTP %s: %lld chain / %lld tree verify steps replayed, tokens identical to eager\n",
                  what.c_str(), static_cast<long long>(graphs.counts.verify),
                  static_cast<long long>(tree_graphs.counts.tree_verify));
      if (l.dp_attention && l.tp == 1) {  // the switch keeps every step eager
        setenv("MXSERVE_TP_GRAPHS", "0", 1);
        const GraphRun off = run_graph_engine(**lm, prompts, true);
        unsetenv("MXSERVE_TP_GRAPHS");
        EXPECT_EQ(off.replays, 0) << what << ": MXSERVE_TP_GRAPHS=0 should keep DP steps eager";
        EXPECT_EQ(off.tokens, run_graph_engine(**lm, prompts, false).tokens) << what;
      }
    }
  }
}

}  // namespace
}  // namespace mxserve::launch
