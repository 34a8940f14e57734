#!/bin/bash
# The decode split tuner alone (issue 17 item 5), a grid small enough for one device call: GLM-4.x heads
# (96 / 8 / 128), bf16 and FP8 caches; TUNE_ARGS overrides the grid (default rows 1,4,16,64 x contexts
# 2k,8k,32k,128k: the table's lookup snaps to the nearest bucket on a log scale). Writes the tables to $OUT.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
ARGS=${TUNE_ARGS:---rows 1,4,16,64 --contexts 2048,8192,32768,131072}
for dt in bf16 fp8_e4m3; do
  s=$(date +%s)
  timeout ${TUNE_SECS:-170} "$P/bin/mxserve" tune-attention --heads 96 --kv-heads 8 --head-dim 128 --kv-cache-dtype "$dt" \
    $ARGS --out "$OUT/nvidia_h200_Q96_KV8_D128_$dt.json" > "$OUT/tune_$dt.log" 2>&1
  echo "tune-attention $dt rc=$? in $(( $(date +%s) - s )) s"; tail -22 "$OUT/tune_$dt.log"
done
