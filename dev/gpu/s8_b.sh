#!/bin/bash
# Session 8, second call: correctness of the merged helpers' GPU work side by side (the persistent MXFP4 MoE decode
# path, the split / FP8 fused DSA indexer, MTP extend + tree graphs, the fused all-reduce and graphs at tp > 1 on the
# stand-in, verify-fixture with graphs on both glm_moe_dsa fixtures), then the benchmarks one at a time (MoE design 9,
# the indexer variants) and the 8-layer GLM-5.2 decode step with design 9 off / on (same binary).
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd) MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
: > "$OUT/rc.txt"
( timeout 200 "$B/test_cuda_moe_mxfp4_pd" --gtest_color=no > "$OUT/t_moe_pd.log" 2>&1; echo "test_cuda_moe_mxfp4_pd rc=$?" >> "$OUT/rc.txt" ) &
( timeout 200 "$B/test_cuda_mla_dsa" --gtest_color=no > "$OUT/t_mla_dsa.log" 2>&1; echo "test_cuda_mla_dsa rc=$?" >> "$OUT/rc.txt"
  timeout 100 "$B/test_cuda_mla_fp8" --gtest_color=no > "$OUT/t_mla_fp8.log" 2>&1; echo "test_cuda_mla_fp8 rc=$?" >> "$OUT/rc.txt" ) &
( timeout 240 "$B/test_cuda_graphs" --gtest_color=no > "$OUT/t_graphs.log" 2>&1; echo "test_cuda_graphs rc=$?" >> "$OUT/rc.txt" ) &
( OUT=$OUT/fusedar timeout 300 bash "$P/gpu/fusedar.sh" 1 > "$OUT/fusedar1.log" 2>&1; echo "fusedar.sh 1 rc=$?" >> "$OUT/rc.txt" ) &
( for fx in glm_moe_dsa_tiny_a glm_moe_dsa_tiny_b glm4_moe_tiny_a; do
    timeout 100 "$B/mxserve" verify-fixture "$P/fixtures/$fx" --backend cuda > "$OUT/vf_$fx.log" 2>&1
    echo "verify-fixture $fx rc=$?" >> "$OUT/rc.txt"; done ) &
wait; sort "$OUT/rc.txt"; t "tests done"
for f in "$OUT"/t_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK' $f) ok"; grep -E "^\[  FAILED|^FAIL" "$f" | head -8; done
grep -E "^(PASS|FAIL)" "$OUT/t_moe_pd.log" | head -40
grep -E "^\[ (fused|split|ring) " "$OUT/t_mla_dsa.log" | grep -v PASS | head; grep -E "^\[ indexer \] FP8 fused" "$OUT/t_mla_fp8.log" | head -4
grep -hE "extend|tree verify|replays" "$OUT/t_graphs.log" | cut -c1-200 | head -16
cat "$OUT/fusedar1.log" | cut -c1-220 | head -40
grep -hE "replay|cuda graphs|failed checks" "$OUT"/vf_*.log | cut -c1-200 | head -12
t "bench moe design 9"; timeout 150 "$B/bench_moe_mxfp4_pd" > "$OUT/b_moe_pd.log" 2>&1; echo rc=$?; cat "$OUT/b_moe_pd.log" | cut -c1-200 | tail -60
t "bench indexer"; timeout 150 "$B/bench_dsa_indexer" --quick > "$OUT/b_idx.log" 2>&1; echo rc=$?; cat "$OUT/b_idx.log" | cut -c1-200 | tail -45
t "GLM-5.2 decode step, design 9 off / on"; OUT=$OUT/e2e MOE_PD_E2E=1 timeout 200 bash "$P/gpu/moe_pd.sh"
grep -hE "decode step|^\| (1|8) " "$OUT"/e2e/*.md 2>/dev/null | head -20
t done
