#!/bin/bash
# glm_moe_dsa's FP8 latent cache on the GPU (issue 36 item 3; docs/kv-cache.md), from a payload folder made by
# dev/make_gpu_payload.sh. Writes to $OUT (or /tmp/mxserve_gpu): mla_fp8_ops.log (test_cuda_mla_fp8: CUDA packed
# rows == CPU bytes, both MLA attend kernels and both indexer score kernels on FP8 rows), mla_fp8_quality.log
# (test_cuda_mla_fp8_quality: decode logits of both glm_moe_dsa fixtures within cuda bf16's distance + the FP8
# envelope), bench_mla_fp8.log (FP8 vs bf16 attend, 64 and 8 heads; target >= 1.7x at 20k), mla_dsa_ops.log
# (test_cuda_mla_dsa: the bf16 paths the change touched), summary.txt. Budget: ~4 minutes on an H100.
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_FIXTURE_ROOT="$P/fixtures"

timeout 240 "$P/bin/test_cuda_mla_fp8" --gtest_color=no > "$OUT/mla_fp8_ops.log" 2>&1
RC_OPS=$?
timeout 240 "$P/bin/test_cuda_mla_fp8_quality" --gtest_color=no > "$OUT/mla_fp8_quality.log" 2>&1
RC_Q=$?
timeout 240 "$P/bin/test_cuda_mla_dsa" --gtest_color=no > "$OUT/mla_dsa_ops.log" 2>&1
RC_DSA=$?
{ timeout 200 "$P/bin/bench_mla_fp8"; timeout 100 "$P/bin/bench_mla_fp8" --heads 8 --quick; } > "$OUT/bench_mla_fp8.log" 2>&1
RC_BENCH=$?
{
  echo "==== summary ===="
  echo "test_cuda_mla_fp8 rc=$RC_OPS   test_cuda_mla_fp8_quality rc=$RC_Q   test_cuda_mla_dsa rc=$RC_DSA   bench rc=$RC_BENCH"
  grep -E "^\[  (     OK|FAILED |SKIPPED) \]|Failure|err  |indexer  |bytes differ|differ" "$OUT/mla_fp8_ops.log" | head -60
  grep -E "^\[  (     OK|FAILED |SKIPPED) \]|Failure|mla fp8" "$OUT/mla_fp8_quality.log" | head -10
  grep -E "FAILED|PASSED" "$OUT/mla_dsa_ops.log" | head -10
  cat "$OUT/bench_mla_fp8.log"
} | tee "$OUT/summary.txt"
