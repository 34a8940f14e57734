// Data parallelism and DP attention on the CPU backend (docs/parallel.md "Data parallel"): dp 2, dp 2 with
// DP attention, and (glm4_moe, where tensor parallelism runs) dp 2 x tp 2 with and without DP attention of
// every committed fixture (glm4_moe and glm_moe_dsa) match
// the fixture's reference logits within its tolerance (cli::verify_fixture_model; that checker's sequences
// all live on DP rank 0, so DP rank 1 runs idle steps that only join the MoE exchanges), and an engine over
// them decodes exactly what the one-rank engine decodes for several concurrent requests spread over both DP
// ranks -- through chunked prefill, prefix-cache reuse, preemption and MTP speculation (chain and tree).
// Unit tests pin the placement policy, the block ranges, the batch split / merge and the bad-input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "cli/fixture.h"
#include "kvcache/block_pool.h"
#include "launch/dp_batch.h"
#include "launch/launch.h"
#include "model/archs/glm4_moe.h"
#include "runtime/dp_placement.h"
#include "runtime/scheduler.h"

namespace mxserve::launch {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures"))
    if (fs::exists(e.path() / "reference.safetensors")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

struct Layout {
  int tp = 1, dp = 1;
  bool dp_attention = false;
  int ep = 1;  // expert parallel: tp (plain DP replicas) or tp x dp (DP attention)
  std::string name() const {
    return "tp " + std::to_string(tp) + " x dp " + std::to_string(dp) + (dp_attention ? " + dp attention" : "") +
           (ep > 1 ? " + ep " + std::to_string(ep) : "");
  }
};

// The layouts every fixture runs (both architectures have tensor and expert parallelism): plain DP, DP
// attention with the experts sliced or partitioned (EP) over all ranks, and the same with tp 2 groups.
std::vector<Layout> layouts_for(const std::string&) {
  return {{1, 2, false}, {1, 2, true}, {1, 2, true, 2}, {2, 2, false}, {2, 2, false, 2}, {2, 2, true}, {2, 2, true, 4}};
}

Result<std::unique_ptr<LaunchedModel>> launch(const std::string& dir, Layout l, bool mtp = true) {
  LaunchConfig lc;
  lc.model.path = dir;
  lc.model.load_mtp = mtp;
  lc.backend = "cpu";
  lc.parallel.tp = l.tp;
  lc.parallel.dp = l.dp;
  lc.parallel.dp_attention = l.dp_attention;
  lc.parallel.ep = l.ep;
  lc.cpu_group.timeout = std::chrono::seconds(60);
  return launch_model(lc);
}

// ---- placement, block ranges, split / merge ----

TEST(DpPlacement, PrefixHitWinsThenFreeKvThenLoad) {
  using runtime::DpRankLoad;
  // A prefix hit beats more free blocks and fewer running sequences.
  EXPECT_EQ(runtime::place_on_dp_rank({{0, 100, 0}, {8, 10, 5}}), 1);
  EXPECT_EQ(runtime::place_on_dp_rank({{16, 1, 9}, {8, 100, 0}}), 0);  // the longer hit
  // No hit anywhere: the most free KV blocks.
  EXPECT_EQ(runtime::place_on_dp_rank({{0, 10, 0}, {0, 30, 7}, {0, 20, 0}}), 1);
  // Equal free blocks: the fewest running sequences; full ties: the lowest rank.
  EXPECT_EQ(runtime::place_on_dp_rank({{0, 30, 4}, {0, 30, 2}}), 1);
  EXPECT_EQ(runtime::place_on_dp_rank({{0, 30, 2}, {0, 30, 2}}), 0);
}

TEST(DpPlacement, BlockPoolRangesKeepEachRankInItsBlocks) {
  kvcache::BlockPool pool(10, 3);  // ranges [0, 3), [3, 6), [6, 10)
  EXPECT_EQ(pool.range_begin(1), 3);
  EXPECT_EQ(pool.range_begin(2), 6);
  EXPECT_EQ(pool.n_free(2), 4);
  for (int32_t b = 0; b < 10; ++b) EXPECT_EQ(pool.range_of(b), b < 3 ? 0 : b < 6 ? 1 : 2) << b;
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(3, got, 1).is_ok());
  for (int32_t b : got) EXPECT_EQ(pool.range_of(b), 1);
  EXPECT_EQ(pool.n_free(1), 0);
  EXPECT_EQ(pool.n_free(), 7);
  auto more = pool.allocate(1, got, 1);
  ASSERT_FALSE(more.is_ok());
  EXPECT_NE(more.message().find("range 1 of 3"), std::string::npos) << more.message();
  pool.unref(got[0]);
  EXPECT_EQ(pool.n_free(1), 1);  // back on its own range's list
  EXPECT_EQ(pool.n_free(0), 3);
}

TEST(DpPlacement, SchedulerSpreadsRequestsAndFollowsPrefixHits) {
  runtime::SchedulerConfig sc;
  sc.block_size = 4;
  sc.dp_ranks = 2;
  kvcache::BlockPool pool(32, 2);
  runtime::Scheduler sched(sc, pool);
  std::vector<std::unique_ptr<runtime::Sequence>> seqs;
  auto add = [&](std::vector<int32_t> tokens) {
    seqs.push_back(std::make_unique<runtime::Sequence>());
    seqs.back()->tokens = tokens;
    seqs.back()->prompt_len = static_cast<int32_t>(tokens.size());
    sched.add_waiting(seqs.back().get());
    return seqs.back().get();
  };
  std::vector<int32_t> shared = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  runtime::Sequence* a = add(shared);
  runtime::Sequence* b = add({20, 21, 22, 23, 24});
  auto plan = sched.schedule();
  EXPECT_EQ(a->dp_rank, 0);  // both empty: the lowest rank
  EXPECT_EQ(b->dp_rank, 1);  // then the rank with more free blocks
  for (runtime::Sequence* s : {a, b})
    for (int32_t blk : s->block_table) EXPECT_EQ(pool.range_of(blk), s->dp_rank);
  sched.commit(plan);
  sched.remove(a);  // a finishes: its full blocks go to rank 0's prefix cache
  sched.release(a);
  // c has a's prefix: rank 0 wins on the hit (rank 1's prefix cache has none of it).
  std::vector<int32_t> c_tokens = shared;
  c_tokens.push_back(42);
  runtime::Sequence* c = add(c_tokens);
  plan = sched.schedule();
  EXPECT_EQ(c->dp_rank, 0);
  EXPECT_EQ(c->n_computed, 8) << "two cached blocks of rank 0";
  EXPECT_EQ(sched.prefix_cache(1)->match_length(shared, 8), 0);  // a's blocks are rank 0's only
  for (int r = 0; r < 2; ++r)
    sched.prefix_cache(r)->for_each_block([&](int32_t blk, int64_t) { EXPECT_EQ(pool.range_of(blk), r); });
}

TEST(DpPlacement, SplitAndMergeKeepTheBatchOrder) {
  // 3 sequences over a pool of 8 blocks in 2 ranges: seq 0 on rank 1 (blocks 5, 6), seq 1 on rank 0, seq 2 on 1.
  model::ForwardBatch batch;
  batch.token_ids = {10, 11, 12, 13, 14, 15};
  batch.positions = {0, 1, 2, 0, 0, 1};
  auto span = [](int32_t begin, int32_t n, std::vector<int32_t> blocks) {
    model::SequenceSpan s;
    s.token_begin = begin;
    s.n_tokens = n;
    s.kv_len = n;
    s.block_table = std::move(blocks);
    return s;
  };
  batch.seqs = {span(0, 3, {5, 6}), span(3, 1, {0}), span(4, 2, {7})};
  batch.logit_rows = {2, 3, 5};
  auto split = split_by_dp_rank(batch, 2, 8);
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  EXPECT_EQ(split->parts[0].token_ids, (std::vector<int32_t>{13}));
  EXPECT_EQ(split->parts[1].token_ids, (std::vector<int32_t>{10, 11, 12, 14, 15}));
  EXPECT_EQ(split->parts[1].seqs[1].token_begin, 3);
  EXPECT_EQ(split->parts[1].logit_rows, (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(split->logit_index[1], (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(split->logit_index[0], (std::vector<int32_t>{1}));
  Tensor x = Tensor::empty(DType::kF32, {6, 2});
  for (int i = 0; i < 12; ++i) x.data<float>()[i] = static_cast<float>(i);
  std::vector<Tensor> parts = {take_rows(x, split->rows[0]), take_rows(x, split->rows[1])};
  Tensor back = merge_rows(parts, split->rows, 6);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(back.data<float>()[i], static_cast<float>(i));
  batch.seqs[0].block_table = {3, 5};  // one sequence in two ranges: refused, naming it
  auto bad = split_by_dp_rank(batch, 2, 8);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("sequence 0 holds blocks of DP ranks 0 and 1"), std::string::npos)
      << bad.status().message();
}

// ---- the fixtures ----

TEST(DataParallel, MatchesEveryFixtureReference) {
  for (const auto& dir : fixture_dirs()) {
    for (const Layout& l : layouts_for(dir)) {
      auto lm = launch(dir, l);
      ASSERT_TRUE(lm.is_ok()) << dir << " " << l.name() << ": " << lm.status().to_string();
      EXPECT_EQ((*lm)->world(), l.tp * l.dp);
      cli::FixtureOptions opt;
      opt.chunk_size = 3;
      opt.block_size = 4;
      auto report = cli::verify_fixture_model(dir, (*lm)->model(), (*lm)->backend(), opt);
      ASSERT_TRUE(report.is_ok()) << dir << " " << l.name() << ": " << report.status().to_string();
      EXPECT_GT(report->cases, 0) << dir;
      EXPECT_EQ(report->failures, 0) << dir << " " << l.name();
    }
  }
}

// Greedy outputs of several requests through one engine: a first wave of `prompts` submitted together (both
// DP ranks get work), then a second wave sharing the first wave's prefixes (prefix reuse).
struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> cached;
  runtime::EngineStats stats;
};

EngineRun run_engine(LaunchedModel& lm, const std::vector<std::vector<int32_t>>& prompts, int64_t n_blocks,
                     const runtime::SpecConfig& spec = {}) {
  runtime::EngineConfig ec;
  ec.spec = spec;
  ec.scheduler.block_size = 4;
  ec.scheduler.chunked_prefill_size = 5;
  ec.scheduler.max_num_batched_tokens = 12;
  ec.n_blocks = n_blocks;
  ec.max_model_len = 64;
  auto engine = lm.make_engine(ec);
  EngineRun run;
  run.tokens.resize(2 * prompts.size());
  run.cached.resize(2 * prompts.size());
  for (int wave = 0; wave < 2; ++wave) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      const size_t k = wave * prompts.size() + i;
      runtime::RequestSpec req;
      req.prompt = prompts[i];
      if (wave == 1) req.prompt.back() = prompts[(i + 1) % prompts.size()][0];  // same prefix, new last token
      req.sampling.temperature = 0;
      req.sampling.max_tokens = 6;
      req.sampling.ignore_eos = true;
      auto* out = &run.tokens[k];
      auto* cached = &run.cached[k];
      EXPECT_TRUE(engine->submit(req, [out, cached](const runtime::TokenEvent& ev) {
        if (ev.token >= 0) out->push_back(ev.token);
        *cached = ev.usage.cached_tokens;
      }).is_ok());
    }
    while (!engine->idle()) {
      engine->step();
      const Status inv = engine->check_invariants();
      EXPECT_TRUE(inv.is_ok()) << inv.to_string();
      if (!inv.is_ok()) return run;
    }
  }
  run.stats = engine->stats();
  return run;
}

std::vector<std::vector<int32_t>> engine_prompts(LaunchedModel& one, const std::string& dir) {
  auto cases = cli::read_fixture_cases(dir, one.config().vocab_size);
  EXPECT_TRUE(cases.is_ok());
  std::vector<int32_t> base = cases->front().input_ids;
  while (base.size() < 24) base.insert(base.end(), base.begin(), base.end());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {  // four distinct prompts of 13..16 tokens
    std::vector<int32_t> p(base.begin() + i, base.begin() + i + 13 + i);
    p[0] = static_cast<int32_t>((p[0] + 7 * i) % one.config().vocab_size);
    prompts.push_back(p);
  }
  return prompts;
}

TEST(DataParallel, EngineGreedyMatchesOneRankWithConcurrentRequests) {
  for (const auto& dir : fixture_dirs()) {
    auto one = launch(dir, {}, false);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    const auto prompts = engine_prompts(**one, dir);
    const EngineRun want = run_engine(**one, prompts, 64);
    ASSERT_EQ(want.tokens[0].size(), 6u);
    // A small pool (8 blocks of 4 tokens per DP rank; a request needs up to 6) forces preemption on the DP
    // ranks; greedy decoding is unaffected.
    for (const Layout& l : layouts_for(dir)) {
      auto lm = launch(dir, l, false);
      ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
      const EngineRun got = run_engine(**lm, prompts, 64);
      EXPECT_EQ(got.tokens, want.tokens) << dir << " " << l.name();
      for (size_t k = prompts.size(); k < got.cached.size(); ++k)
        EXPECT_GE(got.cached[k], 8) << dir << " " << l.name() << ": request " << k << " should reuse its prefix";
      const EngineRun small = run_engine(**lm, prompts, 16);
      EXPECT_EQ(small.tokens, want.tokens) << dir << " " << l.name() << " (small pool)";
      EXPECT_GT(small.stats.scheduler.preemptions, 0) << dir << " " << l.name() << ": the small pool should preempt";
      // An odd pool (17 blocks: DP ranges [0, 8) and [8, 17)) next to the executor's scratch block: the DP split
      // must use the pool's ranges, not the cache's 18 blocks (the GPU run of 2026-12-06 failed every request
      // with "DP split: sequence 0 holds blocks of DP ranks 1 and 0" at 17623 blocks).
      EXPECT_EQ(run_engine(**lm, prompts, 17).tokens, want.tokens) << dir << " " << l.name() << " (odd pool)";
    }
    // MTP speculation is lossless under DP attention: chain and tree drafts give the one-rank greedy tokens.
    auto spec_lm = launch(dir, {1, 2, true}, true);
    ASSERT_TRUE(spec_lm.is_ok()) << spec_lm.status().to_string();
    runtime::SpecConfig chain;
    chain.num_steps = 2;
    chain.adaptive = false;
    chain.self_test = false;
    EXPECT_EQ(run_engine(**spec_lm, prompts, 64, chain).tokens, want.tokens) << dir << " chain MTP, dp attention";
    runtime::SpecConfig tree = chain;
    tree.topk = 2;
    tree.num_draft_tokens = 5;
    EXPECT_EQ(run_engine(**spec_lm, prompts, 64, tree).tokens, want.tokens) << dir << " tree MTP, dp attention";
  }
}

// ---- bad input ----

TEST(DataParallel, BadLayoutsNameTheFlag) {
  const std::string a = fixture_dirs().front();
  parallel::ParallelConfig pc;
  pc.dp_attention = true;
  const Status one = pc.validate();
  ASSERT_FALSE(one.is_ok());
  EXPECT_NE(one.message().find("--enable-dp-attention needs --data-parallel-size > 1"), std::string::npos)
      << one.message();
  LaunchConfig lc;
  lc.model.path = a;
  lc.backend = "cuda";
  lc.parallel.dp = 2;
  auto cuda = launch_model(lc);
  ASSERT_FALSE(cuda.is_ok());
  EXPECT_NE(cuda.status().message().find("--data-parallel-size 2"), std::string::npos) << cuda.status().message();
  // DP runs on CUDA (NCCL sub-groups per DP rank, or the shared-device stand-in); here (and on a one-GPU
  // machine) the two ranks need two GPUs.
  EXPECT_NE(cuda.status().message().find("ranks need one GPU each"), std::string::npos) << cuda.status().message();
  lc.backend = "cpu";
  lc.parallel = {.tp = 1, .dp = 2, .dp_attention = true};
  lc.model.path = a + "/config.json";
  lc.model.synthetic = true;
  lc.model.synthetic_quantization = "mxfp4";
  auto quantized = launch_model(lc);
  ASSERT_FALSE(quantized.is_ok());
  EXPECT_NE(quantized.status().message().find("--enable-dp-attention"), std::string::npos)
      << quantized.status().message();

  model::ModelConfig c;
  c.source = "config.json";
  c.arch = &model::glm4_moe_architecture();
  c.n_experts = 4, c.moe_inter = 32, c.n_shared_experts = 1;
  EXPECT_TRUE(check_data_parallel(c, {.tp = 2, .dp = 2, .dp_attention = true}).is_ok());
  EXPECT_TRUE(check_data_parallel(c, {.dp = 3}).is_ok());  // plain DP replicates whole models
  const Status three = check_data_parallel(c, {.dp = 3, .dp_attention = true});
  EXPECT_NE(three.message().find("does not divide moe_intermediate_size 32"), std::string::npos) << three.message();
  c.n_experts = 0;
  EXPECT_NE(check_data_parallel(c, {.dp = 2, .dp_attention = true}).message().find("no routed experts"),
            std::string::npos);
}

}  // namespace
}  // namespace mxserve::launch
