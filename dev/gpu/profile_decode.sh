#!/bin/bash
# Where a decode step's time goes, per kernel (Nsight Compute, kernel durations only, clocks left alone):
# GLM-4.5-Air truncated to 8 layers, MXFP4 experts, eager (no graphs, so each kernel is its own launch),
# batch 1 and batch 16, 16-token prompt, 12 new tokens. Prints the kernels by total time per decode token
# (prefill is one of the 13 forward passes and is tiny). Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin/mxserve"; AIR="$P/configs/air.json"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for B in 1 16; do
  timeout 200 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$BIN" generate --config "$AIR" --synthetic-weights --quantization mxfp4 --num-layers 8 --backend cuda \
    --batch $B --prompt-len 16 --max-tokens 12 --ignore-eos --disable-cuda-graph > "$OUT/ncu_b$B.csv" 2> "$OUT/ncu_b$B.err"
  echo "batch $B: ncu rc=$?"
  python3 "$P/gpu/ncu_agg.py" "$OUT/ncu_b$B.csv" 13
done
