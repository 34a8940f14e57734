#!/bin/bash
# Issue 17 item 2: the engine's decode loop with CUDA graphs off and on (GLM-4.5-Air 8 layers, MXFP4 experts,
# batch 1 and 8, greedy), same binary, same run: decode tok/s and the capture time. Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin/mxserve"; AIR="$P/configs/air.json"
for mode in eager graph; do
  F=(); [ $mode = graph ] && F=(--cuda-graph)
  timeout 100 "$BIN" generate --config "$AIR" --synthetic-weights --quantization mxfp4 --num-layers 8 --backend cuda \
    --prompt-len 512 --max-tokens 256 --ignore-eos --runs "b=1;b=8;b=32" "${F[@]}" > "$OUT/graphs_$mode.log" 2>&1
  echo "$mode rc=$?"; grep -E "RESULT|captur|graph" "$OUT/graphs_$mode.log" | cut -c1-300 | tail -6
done
