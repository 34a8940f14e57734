// Sampling inside the decode CUDA graphs (runtime/graph_sampler.h; label gpu, skips without a CUDA device):
//   - the tail alone: a captured argmax + device sampler over fixed slots, replayed with staged rows, returns
//     exactly Backend::sample_rows's tokens / logprobs / top logprobs and argmax_rows's ids for the same
//     logits, every skipped slot (padding included) holds kSampleBadRow (no token), and re-staging between
//     replays (fewer rows, none, a refused step) leaves no stale slot;
//   - through the engine on the graph tests' fixtures: greedy, greedy with penalties, seeded temperature /
//     top-k / top-p / min-p, penalties + logit_bias and logprobs requests at batches 1, 3, 5, 8 (padded buckets
//     included) give identical tokens, logprobs and top logprobs with the sampler inside the graph and after
//     the replay (MXSERVE_GRAPH_SAMPLING=0, today's path), with the same number of replays and > 0 replays
//     sampled inside the graph; a request asking more top logprobs than the tail returns makes its steps
//     sample after the replay, and the tokens stay identical.
// MXSERVE_FIXTURE_ROOT overrides the fixtures directory (the GPU machine runs from a copied tree).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "runtime/graph_sampler.h"

namespace mxserve::runtime {
namespace {

std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return (env ? std::string(env) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures") + "/" + name;
}

void expect_same_rows(const std::vector<kernels::SampledRow>& got, const std::vector<kernels::SampledRow>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << what << " row " << i;
    EXPECT_EQ(got[i].logprob, want[i].logprob) << what << " row " << i;
    EXPECT_EQ(got[i].error, want[i].error) << what << " row " << i;
    EXPECT_EQ(got[i].top, want[i].top) << what << " row " << i;
  }
}

// Slots whose result is not kSampleBadRow (a skipped slot's marker), from the raw tail output.
std::vector<int64_t> live_slots(backend::Backend& b, const GraphSampler& gs, int64_t C) {
  const Tensor h = b.to_host(gs.output_buffer());
  const GraphTailLayout l = GraphTailLayout::of(C, gs.caps().max_top);
  std::vector<int64_t> live;
  for (int64_t s = 0; s < C; ++s) {
    backend::DeviceSampleSlot r;
    std::memcpy(&r, h.data<int32_t>() + l.results + 4 * s, sizeof(r));
    if (r.error != kernels::kSampleBadRow) live.push_back(s);
  }
  return live;
}

TEST(GraphSamplerTail, ReplayEqualsSampleRowsAndSkipsEveryOtherSlot) {
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  backend::Backend& b = **be;
  const int64_t C = 8, T = 5, V = 3001;
  Tensor logits = b.alloc(DType::kF32, {C, V});
  std::vector<float> host(C * V);
  auto fill = [&](int salt) {
    for (int64_t i = 0; i < C * V; ++i)
      host[i] = static_cast<float>(((i + salt) * 7919 + salt * 31) % 2003) / 211.f - 4.f;
    b.write_from_host(logits, 0, Tensor::view_of(host.data(), DType::kF32, {C * V}));
  };
  fill(1);
  GraphSampler gs(b, C, V);
  ASSERT_TRUE(gs.allocate().is_ok());
  const GraphSampler::Tail tail = gs.tail(logits, C);
  Status body = Status::ok();
  auto graph = b.capture_graph([&] { body = tail.enqueue(); });
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE(body.is_ok()) << body.to_string();

  auto row = [](int32_t logit_row, float temperature, int32_t n_top, uint64_t seed) {
    kernels::SampleRowParams r;
    r.logit_row = logit_row;
    r.temperature = temperature;
    r.n_top = n_top;
    r.seed = seed;
    r.step = 3;
    return r;
  };
  kernels::SampleRowsInput in;
  in.rows = {row(0, 0.f, 3, 1), row(2, 0.9f, -1, 2), row(4, 1.1f, 0, 3), row(3, 0.7f, 5, 4)};
  in.rows[1].top_k = 50;
  in.rows[1].top_p = 0.9f;
  in.rows[3].min_p = 0.02f;
  in.rows[2].repetition_penalty = 1.3f;
  in.rows[2].frequency_penalty = 0.4f;
  in.penalties = {{10, 2, 1}, {11, 0, 1}, {1200, 1, 0}};
  in.rows[2].penalty_count = 3;
  in.biases = {{7, 9.f}, {7, -1.f}, {2000, 12.f}};
  in.rows[2].bias_count = 3;

  auto check_step = [&](const kernels::SampleRowsInput* step_in, bool expect_sampled, const std::string& what) {
    const bool sampled = gs.stage(step_in, T, C);
    EXPECT_EQ(sampled, expect_sampled) << what;
    (*graph)->replay();
    GraphSampleOutput out;
    gs.read(step_in, T, C, sampled, &out);
    Tensor ids = b.alloc(DType::kI32, {T});
    b.argmax_rows(logits.slice_rows(0, T), ids);
    const Tensor want_ids = b.to_host(ids);
    ASSERT_EQ(out.argmax.size(), static_cast<size_t>(T)) << what;
    for (int64_t r = 0; r < T; ++r) EXPECT_EQ(out.argmax[r], want_ids.data<int32_t>()[r]) << what << " row " << r;
    std::vector<int64_t> want_live;
    if (sampled) {
      expect_same_rows(out.rows, b.sample_rows(logits.slice_rows(0, T), *step_in), what);
      for (size_t i = 0; i < step_in->rows.size(); ++i) want_live.push_back(static_cast<int64_t>(i));  // slots [0, n)
    }
    EXPECT_EQ(live_slots(b, gs, C), want_live) << what << ": a skipped slot (padding or unsampled) holds a result";
  };
  check_step(&in, true, "four rows");
  fill(2);  // new logits, fewer rows: the earlier slots must be skipped again
  kernels::SampleRowsInput one;
  one.rows = {row(1, 1.0f, 2, 9)};
  check_step(&one, true, "one row");
  check_step(nullptr, false, "no rows");
  kernels::SampleRowsInput many_tops = one;
  many_tops.rows[0].n_top = kGraphSampleMaxTop + 1;
  check_step(&many_tops, false, "refused (top logprobs past the cap)");
  check_step(&in, true, "four rows again");
  EXPECT_EQ(gs.sampled_replays(), 3);
}

struct RunResult {
  std::map<size_t, std::vector<int32_t>> tokens;
  std::map<size_t, std::vector<float>> logprobs;
  std::map<size_t, std::vector<std::vector<TopLogprob>>> tops;
  ModelExecutor::GraphReplayCounts counts;
  int64_t replays = 0;
};

// tail: MXSERVE_GRAPH_SAMPLING for this engine's capture (graphs on in both).
RunResult run(model::CausalLM& lm, backend::Backend& be, const std::vector<RequestSpec>& specs, bool tail) {
  ::setenv("MXSERVE_GRAPH_SAMPLING", tail ? "1" : "0", 1);
  EngineConfig cfg;
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_running = 16;
  cfg.max_model_len = 1024;
  cfg.max_logprobs = 32;
  cfg.n_blocks = std::max<int64_t>(256, static_cast<int64_t>(specs.size()) * (1024 / 16 + 2));
  cfg.cuda_graphs = true;
  auto ex = make_model_executor(lm, be, cfg.n_blocks, cfg.scheduler.block_size);
  ModelExecutor* raw = ex.get();
  Engine engine(cfg, std::move(ex));
  ::unsetenv("MXSERVE_GRAPH_SAMPLING");
  RunResult r;
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&r, &index](const TokenEvent& ev) {
      EXPECT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.token < 0) return;
      const size_t k = index.at(ev.id);
      r.tokens[k].push_back(ev.token);
      r.logprobs[k].push_back(ev.logprob);
      r.tops[k].push_back(ev.top_logprobs);
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    index[*id] = i;
  }
  while (!engine.idle()) engine.step();
  r.replays = raw->graph_replays();
  r.counts = raw->graph_replay_counts();
  return r;
}

// Request i of a batch: the parameter sets cycle (greedy first, so batch 1 is greedy).
RequestSpec spec_of(const cli::FixtureCase& c, size_t i, int32_t max_tokens) {
  RequestSpec s;
  s.prompt = c.input_ids;
  s.prompt.push_back(static_cast<int32_t>(1 + i));  // distinct prompts
  SamplingParams& p = s.sampling;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.seed = 4000 + i;
  switch (i % 6) {
    case 0: p.temperature = 0; break;  // greedy: the graph's argmax
    case 1: p.temperature = 0; p.repetition_penalty = 1.4f; p.logprobs = 2; break;  // greedy through the sampler
    case 2: p.temperature = 0.9f; p.top_k = 40; p.top_p = 0.92f; break;
    case 3: p.temperature = 1.2f; p.presence_penalty = 0.6f; p.frequency_penalty = 0.3f;
            p.logit_bias = {{3, 2.5f}, {5, -100.f}}; break;
    case 4: p.temperature = 0.7f; p.min_p = 0.05f; p.logprobs = 5; break;
    default: p.temperature = 1.0f; p.logprobs = 0; break;
  }
  return s;
}

void expect_same_run(const RunResult& got, const RunResult& want, size_t n, size_t max_tokens, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(want.tokens.at(i).size(), max_tokens) << what << " request " << i;
    EXPECT_EQ(got.tokens.at(i), want.tokens.at(i)) << what << " request " << i;
    EXPECT_EQ(got.logprobs.at(i), want.logprobs.at(i)) << what << " request " << i;
    const auto& gt = got.tops.at(i);
    const auto& wt = want.tops.at(i);
    ASSERT_EQ(gt.size(), wt.size()) << what << " request " << i;
    for (size_t t = 0; t < gt.size(); ++t) {
      ASSERT_EQ(gt[t].size(), wt[t].size()) << what << " request " << i << " token " << t;
      for (size_t j = 0; j < gt[t].size(); ++j) {
        EXPECT_EQ(gt[t][j].token, wt[t][j].token) << what << " request " << i << " token " << t;
        EXPECT_EQ(gt[t][j].logprob, wt[t][j].logprob) << what << " request " << i << " token " << t;
      }
    }
  }
}

class CudaGraphSampling : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGraphSampling, TokensEqualWithTheSamplerInsideAndAfterTheGraph) {
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  const std::string dir = fixture_dir(GetParam());
  model::LoadOptions lo;
  lo.load_mtp = false;
  auto lm = model::load_causal_lm(dir, **be, lo);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  auto cases = cli::read_fixture_cases(dir, (*lm)->config().vocab_size);
  ASSERT_TRUE(cases.is_ok()) << cases.status().to_string();
  ASSERT_FALSE(cases->empty());
  for (size_t batch : {1, 3, 5, 8}) {
    std::vector<RequestSpec> specs;
    for (size_t i = 0; i < batch; ++i) specs.push_back(spec_of((*cases)[i % cases->size()], i, 24));
    const RunResult after = run(**lm, **be, specs, false);
    const RunResult inside = run(**lm, **be, specs, true);
    const std::string what = GetParam() + " batch " + std::to_string(batch);
    std::printf("%s: %lld decode replays, %lld sampled inside the graph (after: %lld)\n", what.c_str(),
                static_cast<long long>(inside.counts.decode), static_cast<long long>(inside.counts.sampled),
                static_cast<long long>(after.counts.sampled));
    EXPECT_GT(inside.replays, 0) << what;
    EXPECT_EQ(inside.replays, after.replays) << what;
    EXPECT_EQ(after.counts.sampled, 0) << what << ": MXSERVE_GRAPH_SAMPLING=0 still sampled in the graph";
    if (batch > 1) {
      EXPECT_GT(inside.counts.sampled, 0) << what << ": no replay sampled inside the graph";
    }
    expect_same_run(inside, after, batch, 24, what);
  }
  // A request asking more top logprobs than the tail returns: its steps sample after the replay (said once),
  // the later ones (it ends first) inside; tokens identical either way.
  std::vector<RequestSpec> specs;
  for (size_t i = 0; i < 4; ++i) specs.push_back(spec_of((*cases)[i % cases->size()], i + 2, 16));
  specs[0].sampling.logprobs = kGraphSampleMaxTop + 5;
  specs[0].sampling.max_tokens = 6;
  const RunResult after = run(**lm, **be, specs, false);
  const RunResult inside = run(**lm, **be, specs, true);
  const std::string what = GetParam() + " with " + std::to_string(kGraphSampleMaxTop + 5) + " top logprobs";
  EXPECT_GT(inside.counts.sampled, 0) << what;
  EXPECT_LT(inside.counts.sampled, inside.counts.decode) << what << ": its steps should have sampled after the replay";
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(inside.tokens.at(i), after.tokens.at(i)) << what << " request " << i;
    EXPECT_EQ(inside.logprobs.at(i), after.logprobs.at(i)) << what << " request " << i;
  }
  EXPECT_EQ(inside.tops.at(0).at(0).size(), static_cast<size_t>(kGraphSampleMaxTop + 5)) << what;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraphSampling,
                         ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b", "glm_moe_dsa_tiny_a"));

}  // namespace
}  // namespace mxserve::runtime
