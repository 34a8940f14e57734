// Scheduler policy: decodes are never starved by long prefills; budgets (and the ITL target) hold every step.
#include <gtest/gtest.h>

#include <memory>

#include "runtime/scheduler.h"
#include "runtime/step_cost_model.h"

namespace mxserve::runtime {
namespace {

std::unique_ptr<Sequence> make_seq(RequestId id, int32_t len) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->admit_order = id;
  s->tokens.assign(len, static_cast<int32_t>(id));
  s->prompt_len = len;
  return s;
}

TEST(Scheduler, DecodesEveryStepDespiteLongPrefills) {
  SchedulerConfig cfg;
  cfg.block_size = 16;
  cfg.max_num_batched_tokens = 600;
  cfg.chunked_prefill_size = 512;
  cfg.max_running = 64;
  cfg.enable_prefix_cache = false;
  kvcache::BlockPool pool(100000);
  Scheduler sched(cfg, pool);
  std::vector<std::unique_ptr<Sequence>> seqs;
  // Four short requests become decodes; then a stream of 20k-token prompts arrives.
  for (RequestId id = 1; id <= 4; ++id) {
    seqs.push_back(make_seq(id, 8));
    sched.add_waiting(seqs.back().get());
  }
  for (int step = 0; step < 200; ++step) {
    if (step % 5 == 0) {
      seqs.push_back(make_seq(100 + step, 20000));
      sched.add_waiting(seqs.back().get());
    }
    SchedulePlan plan = sched.schedule();
    EXPECT_LE(plan.n_tokens, cfg.max_num_batched_tokens);
    EXPECT_LE(plan.n_prefill_tokens, cfg.chunked_prefill_size);
    // Every running sequence that had one token left is in this step.
    int decodes = 0;
    for (const auto& c : plan.chunks) decodes += c.n_tokens == 1 && c.needs_sample;
    if (step > 0) EXPECT_GE(decodes, 4) << "step " << step;
    sched.commit(plan);
    for (const auto& c : plan.chunks)
      if (c.needs_sample) c.seq->tokens.push_back(1);  // the sampled token: one more to compute
  }
}

TEST(Scheduler, PreemptsNewestWhenOutOfBlocks) {
  SchedulerConfig cfg;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 64;
  cfg.chunked_prefill_size = 64;
  cfg.enable_prefix_cache = false;
  kvcache::BlockPool pool(4);  // 16 tokens
  Scheduler sched(cfg, pool);
  auto a = make_seq(1, 4), b = make_seq(2, 4);
  sched.add_waiting(a.get());
  sched.add_waiting(b.get());
  for (int step = 0; step < 12; ++step) {
    SchedulePlan plan = sched.schedule();
    sched.commit(plan);
    for (const auto& c : plan.chunks)
      if (c.needs_sample) c.seq->tokens.push_back(1);
    EXPECT_LE(pool.n_referenced(), 4);
  }
  EXPECT_GT(sched.counters().preemptions, 0);
  EXPECT_EQ(b->n_preemptions + a->n_preemptions, sched.counters().preemptions);
  EXPECT_GT(b->n_preemptions, 0) << "the newest request is the one preempted";
}

// Under an ITL target a long prefill takes each step's time; a waiting request is looked up in the prefix
// cache every step until it is admitted, but counted once (the hit-rate metrics stay exact), and every
// step with decodes is planned within the target.
TEST(Scheduler, ItlBudgetHoldsBackAdmissionAndCountsLookupsOnce) {
  SchedulerConfig cfg;
  cfg.block_size = 16;
  cfg.max_num_batched_tokens = 8192;
  cfg.chunked_prefill_size = 8192;
  cfg.max_step_seconds = 0.02;
  cfg.min_prefill_chunk = 64;
  kvcache::BlockPool pool(10000);
  Scheduler sched(cfg, pool);
  StepCostModel model;  // scripted: 2 ms + 6 us/prefill token + 100 us/decode row
  for (int i = 0; i < 64; ++i) {
    StepShape s;
    for (int d = 0; d < i % 8; ++d) s.add_chunk(100, 1, 0);
    if (i % 2 == 0) s.add_chunk(0, 64 + 61 * i, 0);
    model.observe(s, 2e-3 + 6e-6 * s.prefill_tokens + 1e-4 * s.decode_rows);
  }
  ASSERT_TRUE(model.ready());
  sched.set_cost_model(&model);
  auto step = [&] {
    SchedulePlan plan = sched.schedule();
    if (plan.itl_limited) {
      EXPECT_LE(model.predict(shape_of(plan)), cfg.max_step_seconds + 1e-9);
    }
    sched.commit(plan);
    for (const auto& c : plan.chunks)
      if (c.needs_sample) c.seq->tokens.push_back(1);
    return plan;
  };
  auto d = make_seq(1, 8), a = make_seq(2, 20000), b = make_seq(3, 100);
  sched.add_waiting(d.get());
  step();  // d decodes from now on
  sched.add_waiting(a.get());
  sched.add_waiting(b.get());
  int held_back = 0;
  while (b->state != SeqState::kRunning) {
    const SchedulePlan plan = step();
    ASSERT_TRUE(plan.itl_limited);
    held_back += b->state != SeqState::kRunning;
    if (b->state != SeqState::kRunning) {
      EXPECT_EQ(sched.counters().prefix_queries_tokens, 7 + 19999);
    }
    ASSERT_LT(held_back, 100);
  }
  EXPECT_GT(held_back, 3) << "a's chunks used each step's time";
  EXPECT_EQ(sched.counters().prefix_queries_tokens, 7 + 19999 + 99);
}

// A mixed step lists plain decode rows first, then speculative verify chunks, then prefill chunks; the
// forward batch's leading decode rows (the attention backend's decode-kernel rows) are exactly the plain
// decodes. Without the reorder B's verify rows would sit between A and C and only A would lead.
TEST(Scheduler, PlainDecodeRowsLeadMixedSteps) {
  SchedulerConfig cfg;
  cfg.block_size = 16;
  cfg.enable_prefix_cache = false;
  kvcache::BlockPool pool(1000);
  Scheduler sched(cfg, pool);
  auto a = make_seq(1, 8), b = make_seq(2, 8), c = make_seq(3, 8), d = make_seq(4, 100);
  for (Sequence* s : {a.get(), b.get(), c.get()}) sched.add_waiting(s);
  SchedulePlan first = sched.schedule();
  ASSERT_EQ(first.chunks.size(), 3u);
  sched.commit(first);
  for (const auto& ch : first.chunks) ch.seq->tokens.push_back(1);
  b->drafts = {5, 6, 7};
  b->draft_parents = {-1, 0, 0};  // a tree: two children of the first draft
  sched.add_waiting(d.get());
  const SchedulePlan plan = sched.schedule();
  ASSERT_EQ(plan.chunks.size(), 4u);
  EXPECT_EQ(plan.chunks[0].seq, a.get());
  EXPECT_EQ(plan.chunks[1].seq, c.get());
  EXPECT_EQ(plan.chunks[2].seq, b.get());
  EXPECT_EQ(plan.chunks[2].n_drafts, 3);
  EXPECT_EQ(plan.chunks[3].seq, d.get());
  EXPECT_EQ(plan.chunks[3].n_tokens, 100);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(is_plain_decode_row(plan.chunks[i]), i < 2) << "chunk " << i;
  const model::ForwardBatch batch = build_forward_batch(plan);
  EXPECT_EQ(model::leading_decode_rows(batch), 2);
  ASSERT_EQ(batch.seqs.size(), 4u);
  EXPECT_EQ(batch.seqs[2].token_begin, 2);
  EXPECT_FALSE(batch.seqs[2].tree_mask.empty());
  // Logit rows follow the same order: a, c, b's four verify rows, d's last row.
  EXPECT_EQ(batch.logit_rows, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 105}));

  // A one-row tree span (a drafted root only) does not lead; a batch opening with a prefill chunk has none.
  model::ForwardBatch tree_only;
  tree_only.seqs.resize(2);
  tree_only.seqs[0].n_tokens = 1;
  tree_only.seqs[0].tree_mask = {1};
  tree_only.seqs[1].n_tokens = 1;
  EXPECT_EQ(model::leading_decode_rows(tree_only), 0);
  model::ForwardBatch prefill_first;
  prefill_first.seqs.resize(2);
  prefill_first.seqs[0].n_tokens = 16;
  prefill_first.seqs[1].n_tokens = 1;
  EXPECT_EQ(model::leading_decode_rows(prefill_first), 0);
}

}  // namespace
}  // namespace mxserve::runtime
