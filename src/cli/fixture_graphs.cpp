// verify-fixture's CUDA-graph check (see fixture_graphs.h): two engines on one model, graphs on and off, same tokens.
#include "cli/fixture_graphs.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "cli/fixture.h"
#include "runtime/engine.h"

namespace mxserve::cli {
namespace {

constexpr int64_t kMinNewTokens = 16;  // decode steps per request (at least; the fixture's greedy length if longer)
constexpr int32_t kMtpSteps = 2;       // the MTP run's fixed draft length

struct EngineRun {
  std::map<size_t, std::vector<int32_t>> tokens;  // by request
  int64_t replays = 0;
  runtime::ModelExecutor::GraphReplayCounts counts;
  runtime::SpecStats spec;
};

Result<EngineRun> run_engine(model::CausalLM& model, backend::Backend& be, const std::vector<runtime::RequestSpec>& specs,
                             int64_t block_size, int64_t max_model_len, bool graphs, int32_t mtp_steps,
                             int dp_ranks) {
  runtime::EngineConfig cfg;
  cfg.scheduler.block_size = block_size;
  cfg.scheduler.dp_ranks = dp_ranks;
  cfg.scheduler.max_running = static_cast<int64_t>(specs.size());
  cfg.max_model_len = max_model_len;
  const int64_t blocks_per_seq = (max_model_len + 2 * kMtpSteps + block_size - 1) / block_size + 2;
  cfg.n_blocks = 2 * blocks_per_seq * static_cast<int64_t>(specs.size()) + 8;
  cfg.cuda_graphs = graphs;
  cfg.spec.num_steps = mtp_steps;
  cfg.spec.adaptive = false;  // every step speculates: the fixture's random weights would lower N to 0
  auto ex = runtime::make_model_executor(model, be, cfg.n_blocks, cfg.scheduler.block_size);
  runtime::ModelExecutor* raw = ex.get();
  runtime::Engine engine(cfg, std::move(ex));
  EngineRun r;
  std::map<runtime::RequestId, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&r, &index](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) r.tokens[index.at(ev.id)].push_back(ev.token);
    });
    MX_RETURN_IF_ERROR(id.status());
    index[*id] = i;
  }
  while (!engine.idle()) {
    engine.step();
    MX_RETURN_IF_ERROR(engine.check_invariants());
  }
  r.replays = raw->graph_replays();
  r.counts = raw->graph_replay_counts();
  r.spec = engine.stats().spec;
  return r;
}

}  // namespace

Result<GraphCheckReport> verify_fixture_graphs(const std::string& dir, model::CausalLM& model, backend::Backend& be,
                                               int64_t block_size, bool mtp_draft_graphs, int dp_ranks) {
  MX_ASSIGN_OR_RETURN(auto cases, read_fixture_cases(dir, model.config().vocab_size));
  if (cases.empty()) return invalid_argument(dir + ": no fixture cases for the CUDA-graph check");
  std::vector<runtime::RequestSpec> specs;
  int64_t longest = 0;
  for (const FixtureCase& c : cases) {
    runtime::RequestSpec s;
    s.prompt = c.input_ids;
    s.sampling.temperature = 0;
    s.sampling.max_tokens = static_cast<int32_t>(std::max<int64_t>(kMinNewTokens, static_cast<int64_t>(c.greedy.size())));
    s.sampling.ignore_eos = true;
    longest = std::max<int64_t>(longest, static_cast<int64_t>(s.prompt.size()) + s.sampling.max_tokens);
    specs.push_back(std::move(s));
  }
  GraphCheckReport report;
  std::vector<int32_t> mtp_runs = {0};
  if (model.has_mtp()) mtp_runs.push_back(kMtpSteps);
  for (int32_t mtp : mtp_runs) {
    MX_ASSIGN_OR_RETURN(EngineRun eager, run_engine(model, be, specs, block_size, longest + 1, false, mtp, dp_ranks));
    MX_ASSIGN_OR_RETURN(EngineRun graph, run_engine(model, be, specs, block_size, longest + 1, true, mtp, dp_ranks));
    int differing = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto e = eager.tokens.find(i), g = graph.tokens.find(i);
      const bool complete = e != eager.tokens.end() &&
                            static_cast<int64_t>(e->second.size()) == specs[i].sampling.max_tokens;
      if (!complete || g == graph.tokens.end() || g->second != e->second) {
        ++differing;
        std::printf("  graphs request %zu (%s): %zu tokens with graphs, %zu eager%s\n", i,
                    mtp ? "MTP" : "plain", g == graph.tokens.end() ? size_t{0} : g->second.size(),
                    e == eager.tokens.end() ? size_t{0} : e->second.size(),
                    complete ? ", sequences differ" : ", eager run incomplete");
      }
    }
    // Plain decoding must have replayed decode graphs; MTP speculation chain verify steps and MTP chain
    // continuation steps, with the same drafts accepted (greedy keeps tokens identical even when drafts differ).
    const bool replayed =
        mtp > 0 ? graph.counts.verify > 0 && (graph.counts.mtp > 0 || !mtp_draft_graphs) : graph.replays > 0;
    const bool same_accepts = graph.spec.num_draft_tokens == eager.spec.num_draft_tokens &&
                              graph.spec.accepted_per_pos == eager.spec.accepted_per_pos;
    if (!same_accepts)
      std::printf("  graphs + MTP: %lld of %lld drafts accepted with graphs, %lld of %lld eager\n",
                  static_cast<long long>(graph.spec.num_accepted_tokens),
                  static_cast<long long>(graph.spec.num_draft_tokens),
                  static_cast<long long>(eager.spec.num_accepted_tokens),
                  static_cast<long long>(eager.spec.num_draft_tokens));
    const bool ok = differing == 0 && same_accepts && replayed && eager.replays == 0;
    ++report.checks;
    report.failures += ok ? 0 : 1;
    if (mtp == 0) report.replays = graph.replays;
    std::printf("cuda graphs%s: %zu greedy requests at once, %lld decode / %lld verify / %lld MTP steps replayed: "
                "tokens %s eager%s  %s\n",
                mtp ? " + MTP (chain, 2 drafts)" : "", specs.size(), static_cast<long long>(graph.counts.decode),
                static_cast<long long>(graph.counts.verify), static_cast<long long>(graph.counts.mtp),
                differing == 0 ? "identical to" : "DIFFER from", same_accepts ? "" : ", accepted drafts DIFFER",
                ok ? "PASS" : (replayed ? "FAIL" : "FAIL (no step replayed from a graph: see the log above)"));
  }
  return report;
}

}  // namespace mxserve::cli
