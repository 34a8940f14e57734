#!/bin/bash
# Behaviour-unchanged check of a refactor: `bench-model --quick` (GLM-4.5-Air truncated to 2 layers, bf16 and
# MXFP4 experts) with the payload's mxserve and with a "before" mxserve given in $MXSERVE_BEFORE_BIN (a binary
# of the base commit, carried beside the payload), alternated twice so clock drift shows. Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BEFORE=${MXSERVE_BEFORE_BIN:-}
AIR="$P/configs/air.json"
SIZES=(--batches 1,8 --contexts 2048 --prefill 1024)
run() {  # label binary quant
  local q=(); [ "$3" = mxfp4 ] && q=(--quantization mxfp4)
  timeout 150 "$2" bench-model --config "$AIR" --synthetic-weights --num-layers 2 --backend cuda "${q[@]}" "${SIZES[@]}" \
    --md "$OUT/$1_$3.md" > "$OUT/$1_$3.log" 2>&1
  echo "---- $1 $3 rc=$?"; grep -iE "decode step|moe|attention" "$OUT/$1_$3.md" | head -12
}
for round in 1 2; do
  for q in bf16 mxfp4; do
    [ -n "$BEFORE" ] && [ -x "$BEFORE" ] && run "before$round" "$BEFORE" $q
    run "after$round" "$P/bin/mxserve" $q
  done
done
