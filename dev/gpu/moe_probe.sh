#!/bin/bash
# MXFP4 MoE microbenchmark on the shipped tables (configs/moe) with the limit probe of design 5's gate_up
# (`bench-kernels moe --probe`: whole / weight loads only / math only), GLM-4.5-Air and GLM-5.2 shapes.
#   -> $OUT/probe_{air,glm52}.md (the tables), $OUT/probe_*.log
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
for shape in "air 128 4096 1408" "glm52 256 6144 2048"; do
  set -- $shape
  timeout 100 "$P/bin/mxserve" bench-kernels moe --experts $2 --hidden $3 --inter $4 --top-k 8 --probe \
    --table "$P/configs/moe/nvidia_h200_E$2_H$3_I$4_K8_mxfp4.json" --md "$OUT/probe_$1.md" > "$OUT/probe_$1.log" 2>&1
  echo "$1 rc=$?"
  grep -E "^\| |ceilings" "$OUT/probe_$1.md"
done
