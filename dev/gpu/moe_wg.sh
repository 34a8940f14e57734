#!/bin/bash
# The wg_* MXFP4 MoE prefill kernels (issue 18, Hopper wgmma) on the GPU machine, from a payload folder made by
# dev/make_gpu_payload.sh: their op test at GLM-4.5-Air / GLM-5.2 sizes (PASS/FAIL line per case) and the
# benchmark against pf_t128 (us, TFLOP/s, fraction of 798 TFLOP/s) -> $OUT/moe_wg_test.log, $OUT/moe_wg_bench.log.
#   usage: moe_wg.sh [M ...]        (OUT defaults to /tmp/mxserve_gpu; M defaults to 2048 8192 16384)
set -u
. "$(dirname "$0")/payload_env.sh"
timeout 300 "$P/bin/test_cuda_moe_mxfp4_wg" --gtest_color=no > "$OUT/moe_wg_test.log" 2>&1
echo "test rc=$? (124 = timeout)"
grep -E "^(PASS|FAIL) |seed|^\[  (PASSED|FAILED) |warn" "$OUT/moe_wg_test.log"
timeout 300 "$P/bin/bench_moe_mxfp4_wg" "$@" 2>&1 | tee "$OUT/moe_wg_bench.log"
