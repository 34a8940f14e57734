// The start-up dry run's shape (launch/launch_memory.h dry_run_shape, a pure function): the largest step a
// serving scheduler can make -- a full prefill chunk plus the decode / MTP-verify rows of every running
// sequence, within --max-num-batched-tokens and --max-model-len -- and prompts of two such steps per DP group.
#include <gtest/gtest.h>

#include "launch/launch_memory.h"

namespace mxserve::launch {
namespace {

KvBudgetRequest request(int64_t batched, int64_t chunk, int64_t seqs, int mtp_steps, int64_t max_len) {
  KvBudgetRequest r;
  r.max_num_batched_tokens = batched;
  r.chunked_prefill_size = chunk;
  r.max_num_seqs = seqs;
  r.spec.num_steps = mtp_steps;
  r.max_model_len = max_len;
  return r;
}

TEST(DryRunShape, TheDefaultBudgetsProfileOneFullChunkOverTwoChunksOfContext) {
  // --max-num-batched-tokens = --chunked-prefill-size: decode rows share the chunk's budget (no extra rows).
  const DryRunShape s = dry_run_shape(request(2048, 2048, 256, 3, 8192));
  EXPECT_EQ(s.step_rows, 2048);
  EXPECT_EQ(s.extra_rows, 0);
  EXPECT_EQ(s.prompt_tokens, 4096);
}

TEST(DryRunShape, DecodeAndVerifyRowsRideAlongAChunkWithinTheStepBudget) {
  // 16 sequences x (1 + 3 drafts) = 64 rows beside a 2048-token chunk, under a budget of 8192.
  DryRunShape s = dry_run_shape(request(8192, 2048, 16, 3, 0));
  EXPECT_EQ(s.step_rows, 2048 + 64);
  EXPECT_EQ(s.extra_rows, 64);
  EXPECT_EQ(s.prompt_tokens, 2 * (2048 + 64));
  // The step budget caps them: 256 x 4 = 1024 riding rows, but only 2560 rows a step.
  s = dry_run_shape(request(2560, 2048, 256, 3, 0));
  EXPECT_EQ(s.step_rows, 2560);
  EXPECT_EQ(s.extra_rows, 512);
  // No speculation, no --max-num-seqs given: the chunk alone.
  s = dry_run_shape(request(8192, 1024, 0, 0, 0));
  EXPECT_EQ(s.step_rows, 1024);
  EXPECT_EQ(s.extra_rows, 0);
}

TEST(DryRunShape, MaxModelLenCapsTheStepAndThePrompt) {
  // A 512-token context (less the 16 + k the dry run decodes and drafts) caps both.
  DryRunShape s = dry_run_shape(request(2048, 2048, 8, 1, 512));
  EXPECT_EQ(s.step_rows, 512 - 17);
  EXPECT_EQ(s.prompt_tokens, 512 - 17);
  EXPECT_EQ(s.extra_rows, 0);
  s = dry_run_shape(request(2048, 1000, 8, 1, 3000));  // room for the chunk + 16 riding rows, not two full steps
  EXPECT_EQ(s.step_rows, 1016);
  EXPECT_EQ(s.prompt_tokens, 2032);
  s = dry_run_shape(request(2048, 2048, 8, 1, 10));  // degenerate: at least one row
  EXPECT_EQ(s.step_rows, 1);
  EXPECT_EQ(s.prompt_tokens, 1);
}

}  // namespace
}  // namespace mxserve::launch
