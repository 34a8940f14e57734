#!/bin/bash
# The device sampler stage (issue 17, sampler work): test_cuda_sampling (distribution, seeded agreement with the
# CPU sampler, cut boundaries / ties, batch-composition invariance, logprobs, error rows) and bench_cuda_sampling
# (us per step by parameter set, row shape and batch; its last line is PASS / FAIL of top-p at batch 64 < 0.5 ms).
# Then bench_serving_overhead (CPU: the served path's engine-thread time per step per stream).
# Prints the lines the lead pastes back: gtest verdicts, "[ sampling ]" lines, the bench table.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
RC=0
timeout 240 "$P/bin/test_cuda_sampling" --gtest_color=no > "$OUT/test_cuda_sampling.log" 2>&1; rc=$?
echo "test_cuda_sampling rc=$rc"
grep -E "^\[  (     OK|FAILED|  PASSED|  SKIPPED) \]|Failure|Expected|Which is|sampling \]" "$OUT/test_cuda_sampling.log" | head -60
[ $rc = 0 ] || RC=$rc
timeout 120 "$P/bin/bench_cuda_sampling" > "$OUT/bench_cuda_sampling.log" 2>&1; rc=$?
echo "bench_cuda_sampling rc=$rc"; cat "$OUT/bench_cuda_sampling.log"
[ $rc = 0 ] || RC=$rc
if [ -x "$P/bin/bench_serving_overhead" ]; then  # CPU only: the engine thread's host time per step per stream
  timeout 200 "$P/bin/bench_serving_overhead" 100 > "$OUT/bench_serving_overhead.log" 2>&1
  echo "bench_serving_overhead rc=$?"; cat "$OUT/bench_serving_overhead.log"
fi
exit $RC
