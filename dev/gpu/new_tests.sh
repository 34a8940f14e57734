#!/bin/bash
# The GPU tests of the decode-path work (issue 17): CUDA graphs on/off identical greedy tokens, the FP8 KV cache
# against the CPU reference, the device sampler against the CPU sampler (+ its microbenchmark). Each binary is
# optional (a payload from an older tree lacks some). Run by run_all.sh (needs its LD_LIBRARY_PATH).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
RC=0
for t in test_cuda_graphs test_cuda_kv_fp8 test_cuda_sampling; do
  [ -x "$P/bin/$t" ] || { echo "$t: not in this payload"; continue; }
  timeout 120 "$P/bin/$t" --gtest_color=no > "$OUT/$t.log" 2>&1; rc=$?
  echo "$t rc=$rc"; grep -E "^\[  (     OK|FAILED|  PASSED|  SKIPPED) \]|Failure|rel_l2|chi|agree|graph" "$OUT/$t.log" | head -30
  [ $rc = 0 ] || RC=$rc
done
[ -x "$P/bin/bench_cuda_sampling" ] && timeout 60 "$P/bin/bench_cuda_sampling" 2>&1 | tail -36
exit $RC
