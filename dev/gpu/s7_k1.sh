#!/bin/bash
# Session 7, the first merged helpers (issue 36 items 1 and 4): glm_moe_dsa CUDA graphs (test_cuda_graphs, the
# graphs check of verify-fixture on both glm_moe_dsa fixtures) and the fused DSA indexer (its oracle tests, its
# benchmark against the mma path), with the W4A8 GLM-5.2 oracle cases alongside (the last suite run cut them).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd)
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
( timeout 280 "$B/test_cuda_moe_mxfp4_wg8" --gtest_filter='CudaMoeMxfp4Wg8.Glm52' > "$OUT/t_wg8_glm52.log" 2>&1
  echo "test_cuda_moe_mxfp4_wg8 Glm52 rc=$?" > "$OUT/wg8_rc.txt" ) &
timeout 200 "$B/test_cuda_graphs" --gtest_color=no > "$OUT/t_graphs.log" 2>&1; echo "test_cuda_graphs rc=$?"
grep -E "^\[  FAILED|^\[       OK|^\[  SKIPPED|replay" "$OUT/t_graphs.log" | cut -c1-220 | head -40
for fx in glm_moe_dsa_tiny_a glm_moe_dsa_tiny_b glm4_moe_tiny_a; do
  timeout 120 "$B/mxserve" verify-fixture "$P/fixtures/$fx" --backend cuda --max-rel-l2 2e-2 > "$OUT/vf_$fx.log" 2>&1
  echo "verify-fixture $fx rc=$?"; grep -E "cuda graphs|failed checks|BEYOND" "$OUT/vf_$fx.log" | cut -c1-240
done
t "indexer tests"
timeout 200 "$B/test_cuda_mla_dsa" --gtest_color=no > "$OUT/t_mla_dsa.log" 2>&1; echo "test_cuda_mla_dsa rc=$?"
grep -E "^\[  FAILED|^\[       OK|\[ fused \]" "$OUT/t_mla_dsa.log" | cut -c1-220 | head -60
wait; cat "$OUT/wg8_rc.txt"; grep -E "^\[  FAILED|^\[       OK" "$OUT/t_wg8_glm52.log" | head
t "indexer bench"
timeout 120 "$B/bench_dsa_indexer" > "$OUT/bench_dsa_indexer.log" 2>&1; echo "bench_dsa_indexer rc=$?"
cat "$OUT/bench_dsa_indexer.log" | cut -c1-220 | tail -40
t done
