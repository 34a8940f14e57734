#!/bin/bash
# Where a prefill's time goes, per kernel (Nsight Compute durations, clocks left alone): GLM-4.5-Air truncated to
# 8 layers, MXFP4 experts, one 8,192-token prompt, 1 new token, eager. Prints the kernels by total time
# (issue 18's measured limits). Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin/mxserve"; AIR="$P/configs/air.json"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 200 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  "$BIN" generate --config "$AIR" --synthetic-weights --quantization mxfp4 --num-layers 8 --backend cuda \
  --batch 1 --prompt-len ${PF_LEN:-8192} --max-tokens 1 --ignore-eos --disable-cuda-graph > "$OUT/ncu_prefill.csv" 2> "$OUT/ncu_prefill.err"
echo "prefill ${PF_LEN:-8192}: ncu rc=$?"
python3 "$P/gpu/ncu_agg.py" "$OUT/ncu_prefill.csv" 1
