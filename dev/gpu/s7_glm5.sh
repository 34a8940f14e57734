#!/bin/bash
# Session 7 (issue 36): GLM-5.2 geometry (synthetic weights, MXFP4 experts) on the GPU, the binary before the
# session's glm_moe_dsa work ($P/bin/mxserve_before, when the payload carries it) and after, on the same card:
#   1. bench-model rows (decode batch 1 / 16 / 64 x 2k / 20k / 64k, prefill chunks, the whole decode step) at
#      $S7_LAYERS layers (default 8);
#   2. served over HTTP (glm5_serve.sh, plain decoding): single stream and 8 streams, 2000-token prompts.
# $S7_PARTS picks (default "bench serve"); $S7_BINS the binaries (default "mxserve_before mxserve").
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
LAYERS=${S7_LAYERS:-8}; PARTS=" ${S7_PARTS:-bench serve} "
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for bin in ${S7_BINS:-mxserve_before mxserve}; do
  [ -x "$B/$bin" ] || { echo "$bin: not in payload"; continue; }
  if [[ $PARTS == *" bench "* ]]; then
    t "bench-model $bin"
    timeout 300 "$B/$bin" bench-model --config "$P/configs/glm52.json" --synthetic-weights --num-layers "$LAYERS" \
      --quantization mxfp4 --backend cuda --batches 1,16,64 --contexts 2048,20480,65536 --prefill 2048,8192 \
      --model-batches 1,8 --md "$OUT/bm_$bin.md" --json "$OUT/bm_$bin.json" > "$OUT/bm_$bin.log" 2>&1
    echo "bench-model $bin rc=$?"; cat "$OUT/bm_$bin.md" 2>/dev/null | head -60; tail -3 "$OUT/bm_$bin.log"
  fi
  if [[ $PARTS == *" serve "* ]]; then
    t "serve $bin"
    GLM5_BIN="$B/$bin" GLM5_RUNS=nomtp GLM5_C1_REQS=4 GLM5_C8_REQS=16 OUT="$OUT/serve_$bin" \
      timeout 300 bash "$P/gpu/glm5_serve.sh" 2>&1 | grep -E "PASS|FAIL|TPOT|tok/s|summary|c=[18]:" | head -20
  fi
done
t done
