#!/bin/bash
# Session 7, last call: (1) correctness after the last merges side by side -- MTP verify / draft steps in CUDA graphs
# (test_cuda_graphs, verify-fixture's graphs + MTP check on every fixture), the wgmma MLA kernel as the default
# (test_cuda_mla_dsa, test_cuda_fixture), the parallel layouts on the stand-in; (2) GLM-5.2 (8 layers, MXFP4,
# synthetic) bench-model and served, the session's first binary vs this one; MTP with simulated acceptance 2.5;
# (3) the seed's layout as one command on the one-GPU stand-in (issue 32): GLM-5.2 geometry at TP4 x DP2 + DP
# attention + MTP + FP8 KV, `mxserve bench` shared-prefix at 8 concurrent streams.
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd) MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
: > "$OUT/rc.txt"
for tst in test_cuda_graphs test_cuda_mla_dsa test_cuda_fixture test_cuda_shared_device_comm; do
  ( timeout 150 "$B/$tst" --gtest_color=no > "$OUT/t_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/rc.txt" ) &
done
( timeout 150 "$B/test_cuda_parallel_layouts" --gtest_color=no --gtest_filter='-*Fused*' > "$OUT/t_layouts.log" 2>&1
  echo "test_cuda_parallel_layouts (not the fused test) rc=$?" >> "$OUT/rc.txt" ) &
( for fx in glm_moe_dsa_tiny_a glm_moe_dsa_tiny_b glm4_moe_tiny_a glm4_moe_tiny_b; do
    timeout 100 "$B/mxserve" verify-fixture "$P/fixtures/$fx" --backend cuda --max-rel-l2 2e-2 > "$OUT/vf_$fx.log" 2>&1
    echo "verify-fixture $fx rc=$?" >> "$OUT/rc.txt"; done ) &
wait; sort "$OUT/rc.txt"
for f in "$OUT"/t_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK' $f) ok"; grep -E "^\[  FAILED" "$f" | head -5; done
grep -hE "replays|cuda graphs|failed checks" "$OUT"/vf_*.log "$OUT/t_test_cuda_graphs.log" | cut -c1-200 | head -24
t "GLM-5.2 before / after"
OUT=$OUT/glm5 S7_PARTS="bench serve" timeout 200 bash "$P/gpu/s7_glm5.sh" 2>&1 | grep -vE "^\| (attention|moe) \| prefill" | cut -c1-200
t "GLM-5.2 MTP (simulated acceptance 2.5), graphs on"
GLM5_BIN="$B/mxserve" GLM5_RUNS=mtpsim GLM5_C1_REQS=3 GLM5_C8_REQS=8 OUT="$OUT/mtpsim" timeout 120 \
  bash "$P/gpu/glm5_serve.sh" 2>&1 | grep -E "PASS|FAIL|c=[18]:|CUDA graphs" | cut -c1-200
OUT=$OUT bash "$P/gpu/s7_seed.sh"  # the seed layout on the stand-in (its own stage too)
t done
