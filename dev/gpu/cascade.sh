#!/bin/bash
# Cascade (shared-prefix) decode attention on the GPU (issue 33 item 1; docs/kv-cache.md), from a payload folder
# made by dev/make_gpu_payload.sh. Writes to $OUT (or /tmp/mxserve_gpu): cascade_ops.log (test_cuda_cascade_attention:
# the CUDA cascade path vs the per-sequence kernel and the CPU cascade reference, bf16 / FP8, groups of 1..64, graph
# capacities, a mixed batch), cascade_engine.log (test_cuda_cascade_engine: greedy tokens with cascade off / on
# eager / on in graphs on the glm4_moe fixtures, equal or each first divergence judged by the bf16 format bound:
# margin, bound, ratio on its "[ judged  ]" line), graphs.log (test_cuda_graphs: graphs == eager with cascade on by
# default), bench_cascade.log (batch 16, 20k context, 12k shared in groups of 4, and the sweep), summary.txt.
# Budget: ~4 minutes on an H100 / H200.
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_FIXTURE_ROOT="$P/fixtures"

timeout 240 "$P/bin/test_cuda_cascade_attention" --gtest_color=no > "$OUT/cascade_ops.log" 2>&1
RC_OPS=$?
timeout 240 "$P/bin/test_cuda_cascade_engine" --gtest_color=no > "$OUT/cascade_engine.log" 2>&1
RC_ENG=$?
timeout 240 "$P/bin/test_cuda_graphs" --gtest_color=no --gtest_filter='Fixtures/*' > "$OUT/graphs.log" 2>&1
RC_G=$?
timeout 200 "$P/bin/bench_cascade_attention" --sweep > "$OUT/bench_cascade.log" 2>&1
RC_BENCH=$?
{
  echo "==== summary ===="
  echo "test_cuda_cascade_attention rc=$RC_OPS   test_cuda_cascade_engine rc=$RC_ENG   test_cuda_graphs rc=$RC_G   bench rc=$RC_BENCH"
  grep -E "^\[  (     OK|FAILED |SKIPPED) \]|Failure|\[ err" "$OUT/cascade_ops.log" | head -60
  grep -E "^\[  (     OK|FAILED |SKIPPED) \]|Failure|cascade launches|^\[ judged  \]|^  prompt |beyond the bf16 bound" "$OUT/cascade_engine.log" | head -40
  grep -E "FAILED|PASSED" "$OUT/graphs.log" | head -10
  cat "$OUT/bench_cascade.log"
} | tee "$OUT/summary.txt"
