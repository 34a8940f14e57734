#!/bin/bash
# Session 8, last call, part 1: every merged GPU test side by side (graphs incl. MTP extend / tree, cascade attention
# op + engine, device OOM, sliced MXFP4, MLA / DSA ops incl. the early-gather sparse prefill and the fused key writes,
# add_rmsnorm, the fixtures, the MoE prefill dequant path), verify-fixture with graphs on every fixture, then the
# parallel layouts (fused all-reduce and tp > 1 graphs on by default).
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd) MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
: > "$OUT/rc.txt"
g() { local n=$1 to=$2; shift 2; timeout $to "$B/$n" --gtest_color=no "$@" > "$OUT/t_$n.log" 2>&1; echo "$n rc=$?" >> "$OUT/rc.txt"; }
( g test_cuda_graphs 200; g test_cuda_mla_fp8 100 ) &
( g test_cuda_cascade_attention 100; g test_cuda_cascade_engine 150; g test_engine_oom_cuda 100 ) &
( g test_cuda_mla_dsa 200; g test_cuda_mxfp4_slices 150 ) &
( g test_cuda_ops 200; g test_cuda_fixture 200; g test_cuda_engine 150 ) &
( g test_cuda_moe_prefill_dequant 200 ) &
( for fx in glm_moe_dsa_tiny_a glm_moe_dsa_tiny_b glm4_moe_tiny_a glm4_moe_tiny_b; do
    timeout 100 "$B/mxserve" verify-fixture "$P/fixtures/$fx" --backend cuda --max-rel-l2 2e-2 > "$OUT/vf_$fx.log" 2>&1
    echo "verify-fixture $fx rc=$?" >> "$OUT/rc.txt"; done ) &
wait; t "parallel tests done"
g test_cuda_parallel_layouts 200
sort "$OUT/rc.txt"; t "tests done"
for f in "$OUT"/t_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK' $f) ok"; grep -E "^\[  FAILED|Failure|CHECK failed" "$f" | head -6; done
grep -hE "failed checks|replayed" "$OUT"/vf_*.log | cut -c1-200 | head -16
grep -hE "^(CASE|PASS|FAIL) " "$OUT/t_test_cuda_moe_prefill_dequant.log" | head -14
grep -hE "^\[ fused|AddRmsNorm|one fused GEMM" "$OUT"/t_test_cuda_ops.log "$OUT"/t_test_cuda_mla_dsa.log | cut -c1-200 | head -10
grep -hE "early-gather|\[ exact" "$OUT/t_test_cuda_mla_dsa.log" | grep -v PASS | head -6
grep -hE "extend|tree verify" "$OUT/t_test_cuda_graphs.log" | cut -c1-200 | head -8
grep -hE "cascade launches|^\[ (err|cascade)" "$OUT/t_test_cuda_cascade_engine.log" | cut -c1-200 | head -8
grep -hE "^PASS-|FAIL" "$OUT/t_test_cuda_parallel_layouts.log" | cut -c1-200 | head -30
t done
