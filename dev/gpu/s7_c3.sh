#!/bin/bash
# Session 7, one call: the correctness half of s7_k2 (wgmma MLA, FP8 latent, per-layer host tier, fixtures, graphs)
# side by side with parallel7.sh parts a and b (every layout on the one-GPU stand-in), then s7_k2's benchmarks and
# profile alone on the GPU.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
( S7_K2_PART=tests OUT=$OUT/k2 timeout 300 bash "$P/gpu/s7_k2.sh" > "$OUT/k2_tests.txt" 2>&1 ) &
( OUT=$OUT/p7a timeout 330 bash "$P/gpu/parallel7.sh" a > "$OUT/p7a.txt" 2>&1; echo "parallel7 a rc=$?" >> "$OUT/p7a.txt" ) &
( OUT=$OUT/p7b timeout 330 bash "$P/gpu/parallel7.sh" b > "$OUT/p7b.txt" 2>&1; echo "parallel7 b rc=$?" >> "$OUT/p7b.txt" ) &
wait
t "phase 1 done"
cat "$OUT/k2_tests.txt" | cut -c1-250
grep -E "^(PASS|FAIL)|rc=" "$OUT/p7a.txt" "$OUT/p7b.txt" | cut -c1-220
t "benches"
S7_K2_PART=bench OUT=$OUT/k2 timeout 260 bash "$P/gpu/s7_k2.sh" 2>&1 | cut -c1-250
t done
