#!/bin/bash
# Session 7, the second merged group (issue 36 items 2-3, issue 34 item 3): the wgmma MLA decode (oracle tests and
# benchmark), the FP8 latent cache (byte-exact writes, readers, quality, speed), the per-layer host KV tier loads,
# the fixtures on CUDA (regressions), then where a GLM-5.2 batch-1 decode step's time goes (Nsight Compute).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd) MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
PART=${S7_K2_PART:-all}  # tests | bench | all
if [ "$PART" != bench ]; then
: > "$OUT/rc.txt"
for tst in test_cuda_mla_dsa test_cuda_mla_fp8 test_cuda_mla_fp8_quality test_cuda_kv_host_tier test_cuda_fixture \
           test_cuda_graphs; do
  ( [ -x "$B/$tst" ] || { echo "$tst: not in payload" >> "$OUT/rc.txt"; exit 0; }
    timeout 170 "$B/$tst" --gtest_color=no > "$OUT/t_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/rc.txt" ) &
done
wait; sort "$OUT/rc.txt"
for f in "$OUT"/t_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK' $f) ok"; grep -E "^\[  FAILED|Failure" "$f" | head -6; done
grep -E "^\[ err +\].*(FAIL|wgmma 64 heads, decode)|identical|MISMATCH|host KV tier bench|bytes differ|mla fp8|beyond slack" \
  "$OUT"/t_*.log | cut -c1-260 | head -50
fi
[ "$PART" = tests ] && exit 0
t "benches"
timeout 100 "$B/bench_mla_decode" --heads 64 --no-simple > "$OUT/bench_mla_h64.log" 2>&1; echo "bench_mla_decode h64 rc=$?"
grep -E "^case|wgmma|MET|MISSED|^PASS|^FAIL|op / attend" "$OUT/bench_mla_h64.log" | grep -v indexer | cut -c1-200 | head -40
timeout 60 "$B/bench_mla_decode" --heads 8 --no-simple --quick > "$OUT/bench_mla_h8.log" 2>&1; echo "bench_mla_decode h8 rc=$?"
grep -E "^case|wgmma|MET|MISSED|^PASS|^FAIL" "$OUT/bench_mla_h8.log" | grep -v indexer | cut -c1-200 | head -24
timeout 60 "$B/bench_mla_fp8" --quick > "$OUT/bench_mla_fp8.log" 2>&1; echo "bench_mla_fp8 rc=$?"; cut -c1-200 "$OUT/bench_mla_fp8.log" | tail -24
t "profile"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 120 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  "$B/mxserve" generate --config "$P/configs/glm52.json" --synthetic-weights --quantization mxfp4 --num-layers 8 \
  --backend cuda --batch 1 --prompt-len 16 --max-tokens 12 --ignore-eos --disable-cuda-graph > "$OUT/ncu_glm52_b1.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$?"; python3 "$P/gpu/ncu_agg.py" "$OUT/ncu_glm52_b1.csv" 13 | head -34; tail -3 "$OUT/ncu.err"
t done
