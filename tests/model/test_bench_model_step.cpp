// bench-model's decode-step paths (cli/bench_model_step.h) on the CPU through the replaying test backend
// (replaying_backend.h: capture keeps the body, replay runs it again, host copies inside a body fail the test):
// the graph path's layout (a store row and a KV block past the bench's as the padded rows' scratch, the engine's
// buckets and context class) serves a shared-prefix step of a bucket-sized and a padded batch; every timed step
// replays a graph; the replay's greedy ids equal the eager step's; the scratch block and too many sequences are
// refused naming them. The CUDA run is the lead's `mxserve bench-model --backend cuda` (decode step (graph) row).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/bench_model_step.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "replaying_backend.h"

namespace mxserve::cli {
namespace {

constexpr int64_t kBlock = 16, kCtx = 100, kMaxBatch = 4;
constexpr int64_t kPool = kMaxBatch * ((kCtx + kBlock - 1) / kBlock);  // every sequence's own blocks at most

std::string fixture_dir(const std::string& name) { return std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + name; }

TEST(BenchModelStep, GraphStepEqualsEagerOnSharedPrefixBatches) {
  test::ReplayingBackend be(backend::make_cpu_backend());
  auto lm = model::load_causal_lm(fixture_dir("glm4_moe_tiny_b"), be, model::LoadOptions{});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  kvcache::KvCache kv((*lm)->kv_spec(kPool + 1, kBlock), [&be](DType dt, Shape s) { return be.alloc(dt, std::move(s)); });
  uint64_t stream = 1000;
  for (Tensor* t : kv.all_tensors()) {  // random K/V, as bench-model fills its cache
    kernels::SyntheticFill p;
    p.stream = stream++;
    p.stddev = 1.f;
    p.cols = t->dim(-1);
    p.rows = t->numel() / p.cols;
    p.src_cols = p.cols;
    be.fill_synthetic(p, *t, nullptr);
  }
  DecodeStepBench step(**lm, be, kv, kMaxBatch, kCtx, kBlock, kPool);
  ASSERT_TRUE(step.enable_block_tables().is_ok());
  const Status cap = step.capture_graphs();
  ASSERT_TRUE(cap.is_ok()) << cap.to_string();
  ASSERT_TRUE(step.has_graphs());
  const int64_t vocab = (*lm)->config().vocab_size;
  for (int64_t b : {4, 3}) {  // a bucket's size, and a padded batch (3 rows in the 4-row bucket)
    model::ForwardBatch fb = make_bench_batch(b, kCtx, 1, kBlock, true, vocab, /*shared_blocks=*/4, /*prefix_group=*/2);
    const Status rows = step.assign_rows(fb);
    ASSERT_TRUE(rows.is_ok()) << rows.to_string();
    std::vector<int32_t> eager_ids;
    auto eager = step.time_eager(fb, &eager_ids);
    ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(eager_ids.size()), b);
    for (int32_t id : eager_ids) EXPECT_TRUE(id >= 0 && id < vocab) << id;
    const int64_t bodies = be.bodies_run();
    auto graph = step.time_graph(fb, &eager_ids);
    ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
    EXPECT_EQ(graph->replays, kStepWarmup + kStepTimed) << "b=" << b;
    EXPECT_EQ(be.bodies_run() - bodies, kStepWarmup + kStepTimed) << "b=" << b << ": every graph step replays a body";
    EXPECT_EQ(graph->ids_equal_eager, b) << "b=" << b << ": the replay's greedy ids differ from the eager step's";
    EXPECT_GT(graph->ms, 0);
    EXPECT_GT(eager->ms, 0);
  }
  // The scratch block (kPool) is the padded rows' only: a sequence holding it is refused, naming it.
  model::ForwardBatch bad = make_bench_batch(2, kCtx, 1, kBlock, true, vocab);
  bad.seqs[1].block_table.back() = static_cast<int32_t>(kPool);
  const Status scratch = step.assign_rows(bad);
  ASSERT_FALSE(scratch.is_ok());
  EXPECT_NE(scratch.to_string().find("scratch block"), std::string::npos) << scratch.to_string();
  // More sequences than store rows.
  model::ForwardBatch wide = make_bench_batch(kMaxBatch + 1, 16, 1, kBlock, true, vocab);
  const Status too_many = step.assign_rows(wide);
  ASSERT_FALSE(too_many.is_ok());
  EXPECT_NE(too_many.to_string().find("store rows for 4"), std::string::npos) << too_many.to_string();
  // The cascade rule's prediction names why it is off on this backend.
  const CascadeDecision d = cascade_decision(bad, be, (*lm)->config(), kBlock);
  EXPECT_FALSE(d.taken);
  EXPECT_NE(d.describe().find("has none"), std::string::npos) << d.describe();
}

}  // namespace
}  // namespace mxserve::cli
