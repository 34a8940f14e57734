#!/bin/bash
# Session 8, third call: the tests of everything merged (cascade attention, device-OOM handling, sliced MXFP4, the
# rest of the parallel layouts with the fused all-reduce on by default, the FP8 indexer case fixed), verify-fixture
# with graphs on every fixture, then the seed layout at 8 layers MXFP4 (seedmem.sh), the cascade benchmark and the
# stand-in's decode-step split (fusedar.sh 4).
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd) MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
: > "$OUT/rc.txt"
g() { local n=$1 to=$2; shift 2; timeout $to "$B/$n" --gtest_color=no "$@" > "$OUT/t_$n.log" 2>&1; echo "$n rc=$?" >> "$OUT/rc.txt"; }
( g test_cuda_cascade_attention 150; g test_cuda_cascade_engine 150 ) &
( g test_engine_oom_cuda 150; g test_cuda_mxfp4_slices 200 ) &
( g test_cuda_graphs 240; g test_cuda_mla_fp8 100 ) &
( g test_cuda_fixture 200; g test_cuda_shared_device_comm 100; g test_cuda_peer_allreduce 100 ) &
( for fx in glm_moe_dsa_tiny_a glm_moe_dsa_tiny_b glm4_moe_tiny_a glm4_moe_tiny_b; do
    timeout 100 "$B/mxserve" verify-fixture "$P/fixtures/$fx" --backend cuda --max-rel-l2 2e-2 > "$OUT/vf_$fx.log" 2>&1
    echo "verify-fixture $fx rc=$?" >> "$OUT/rc.txt"; done ) &
wait; t "parallel tests done"
g test_cuda_parallel_layouts 300 '--gtest_filter=-*FusedAllReduceMatchesItsUnfusedRun*:*CudaGraphsAtTpAboveOne*'
sort "$OUT/rc.txt"; t "tests done"
for f in "$OUT"/t_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK' $f) ok"; grep -E "^\[  FAILED|Failure" "$f" | head -6; done
grep -hE "cascade launches|^\[ err" "$OUT"/t_test_cuda_cascade_*.log | cut -c1-220 | head -24
grep -hE "replay|failed checks" "$OUT"/vf_*.log | cut -c1-200 | head -16
t "seed layout, 8 layers MXFP4"; OUT=$OUT/seed timeout 240 bash "$P/gpu/s7_seed.sh"
t "cascade bench"; timeout 100 "$B/bench_cascade_attention" --sweep > "$OUT/b_cascade.log" 2>&1; echo rc=$?; cut -c1-200 "$OUT/b_cascade.log" | tail -30
t "decode-step split on the stand-in"; OUT=$OUT/split timeout 150 bash "$P/gpu/fusedar.sh" 4 2>&1 | cut -c1-200 | tail -30
t done
