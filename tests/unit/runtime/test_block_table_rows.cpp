// Device block tables through the real scheduler: random arrivals with shared prefixes (prefix-cache hits),
// a small pool (preemptions), random finishes (row reuse). Each step's batch goes through
// build_attention_meta on the CPU backend with a store; every span's device row must equal its host table,
// the uploaded blocks must be only those not synced before, and the slots must follow the host table.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "backend/backend.h"
#include "kvcache/block_table_store.h"
#include "model/forward_batch.h"
#include "runtime/scheduler.h"

namespace mxserve::runtime {
namespace {

TEST(BlockTableRows, SchedulerLifecycleKeepsDeviceRowsExact) {
  constexpr int64_t kBs = 4, kBlocks = 32, kRunning = 5, kWidth = 40;
  auto be = backend::make_cpu_backend();
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    std::mt19937 rng(seed);
    SchedulerConfig cfg;
    cfg.block_size = kBs;
    cfg.max_num_batched_tokens = 48;
    cfg.chunked_prefill_size = 32;
    cfg.max_running = kRunning;
    kvcache::BlockPool pool(kBlocks);
    Scheduler sched(cfg, pool);
    kvcache::BlockTableStore store(
        kRunning, kWidth, kBlocks, [&](DType dt, Shape s) { return be->alloc(dt, std::move(s)); },
        [&](Tensor& dst, int64_t offset, const Tensor& host) { be->write_from_host(dst, offset, host); });
    std::vector<std::unique_ptr<Sequence>> seqs;
    const std::vector<int32_t> system_prompt = {7, 7, 8, 8, 9, 9, 1, 2, 3, 4, 5};
    RequestId next = 1;
    int64_t preemptions_seen = 0, prefix_hits = 0, steps = 0;
    std::map<int32_t, std::pair<uint64_t, size_t>> synced;  // row -> (lease, blocks synced)
    for (int step = 0; step < 300; ++step) {
      if (rng() % 3 == 0) {
        auto s = std::make_unique<Sequence>();
        s->id = next++;
        if (rng() % 2) s->tokens = system_prompt;
        const int extra = 1 + static_cast<int>(rng() % 12);
        for (int i = 0; i < extra; ++i) s->tokens.push_back(static_cast<int32_t>(10 + rng() % 50));
        s->prompt_len = static_cast<int32_t>(s->tokens.size());
        sched.add_waiting(s.get());
        seqs.push_back(std::move(s));
      }
      SchedulePlan plan = sched.schedule();
      preemptions_seen += static_cast<int64_t>(plan.preempted.size());
      if (plan.empty()) continue;
      ++steps;
      const model::ForwardBatch batch = build_forward_batch(plan);
      size_t expect_new = 0;
      for (const auto& span : batch.seqs) {
        ASSERT_GE(span.table_row, 0);
        ASSERT_EQ(span.host_table, &plan.chunks[&span - batch.seqs.data()].seq->block_table);
        ASSERT_TRUE(span.block_table.empty()) << "engine spans must not copy their tables";
        auto it = synced.find(span.table_row);
        const size_t have = it != synced.end() && it->second.first == span.table_lease ? it->second.second : 0;
        expect_new += span.blocks().size() - std::min(have, span.blocks().size());
      }
      ASSERT_TRUE(batch.validate(1000, kBlocks, kBs).is_ok()) << batch.validate(1000, kBlocks, kBs).to_string();
      kernels::AttentionParams shape;
      const int64_t before = store.uploaded_blocks();
      auto meta = model::build_attention_meta(batch, *be, kBs, shape, &store);
      ASSERT_TRUE(meta.is_ok()) << meta.status().to_string();
      ASSERT_EQ(static_cast<size_t>(store.uploaded_blocks() - before), expect_new) << "seed " << seed << " step " << step;
      ASSERT_EQ(meta.value().params.max_blocks_per_seq, kWidth);
      const int32_t* dev = meta.value().block_tables.data<int32_t>();
      const int32_t* token_row = meta.value().token_seq.data<int32_t>();
      const int32_t* slots = meta.value().slot_mapping.data<int32_t>();
      for (const auto& span : batch.seqs) {
        const auto& table = span.blocks();
        synced[span.table_row] = {span.table_lease, table.size()};
        ASSERT_TRUE(std::equal(table.begin(), table.end(), dev + span.table_row * kWidth))
            << "seed " << seed << " step " << step << " row " << span.table_row;
        for (int32_t i = 0; i < span.n_tokens; ++i) {
          const int32_t j = span.kv_index_of(i);
          ASSERT_EQ(token_row[span.token_begin + i], span.table_row);
          ASSERT_EQ(slots[span.token_begin + i], table[j / kBs] * kBs + j % kBs);
        }
      }
      sched.commit(plan);
      for (const auto& c : plan.chunks) {
        if (!c.needs_sample) continue;
        if (rng() % 25 == 0 || c.seq->tokens.size() > 60) {  // finished: blocks and row go back
          sched.remove(c.seq);
          sched.release(c.seq);
          c.seq->state = SeqState::kFinished;
        } else {
          c.seq->tokens.push_back(static_cast<int32_t>(10 + rng() % 50));
        }
      }
      // Rows are held by exactly the running sequences, each by one.
      std::set<int32_t> rows;
      for (const Sequence* s : sched.running()) {
        ASSERT_GE(s->table_row, 0);
        ASSERT_TRUE(rows.insert(s->table_row).second) << "row " << s->table_row << " held twice";
      }
      for (const Sequence* s : sched.waiting()) ASSERT_EQ(s->table_row, -1);
    }
    prefix_hits += sched.counters().prefix_hit_tokens;
    EXPECT_GT(steps, 100);
    EXPECT_GT(preemptions_seen, 0) << "seed " << seed << ": the pool never ran dry";
    EXPECT_GT(prefix_hits, 0) << "seed " << seed << ": no prefix-shared admission";
  }
}

TEST(BlockTableRows, MixedOrMissingStoreIsAnError) {
  auto be = backend::make_cpu_backend();
  std::vector<int32_t> table = {0, 1};
  model::ForwardBatch b;
  b.token_ids = {1, 2};
  b.positions = {0, 0};
  model::SequenceSpan a;
  a.token_begin = 0;
  a.n_tokens = 1;
  a.kv_len = 1;
  a.table_row = 0;
  a.table_lease = 1;
  a.host_table = &table;
  model::SequenceSpan c;
  c.token_begin = 1;
  c.n_tokens = 1;
  c.kv_len = 1;
  c.block_table = table;
  b.seqs = {a, c};
  kernels::AttentionParams shape;
  auto mixed = model::build_attention_meta(b, *be, 4, shape, nullptr);
  EXPECT_NE(mixed.status().message().find("1 of 2 sequences carry block-table rows"), std::string::npos);
  b.seqs = {a};
  b.token_ids = {1};
  b.positions = {0};
  auto missing = model::build_attention_meta(b, *be, 4, shape, nullptr);
  EXPECT_NE(missing.status().message().find("no block-table store"), std::string::npos);
}

}  // namespace
}  // namespace mxserve::runtime
