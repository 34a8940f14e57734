#!/bin/bash
# Session 6 closing call 2: the before/after `bench-model --quick` of the issue-31 refactors (the payload's mxserve
# vs bin/mxserve_before, the base commit's kernels, alternated), then the agentic trace replay on whole
# GLM-4.5-Air with the host KV tier off and on (trace.sh, reduced: $TRACE_SESSIONS x $TRACE_TURNS).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
t "before/after bench-model"
AIR="$P/configs/air.json"
for round in 1 2; do
  for which in before after; do
    bin=$P/bin/mxserve; [ $which = before ] && bin=$P/bin/mxserve_before
    timeout 100 "$bin" bench-model --config "$AIR" --synthetic-weights --num-layers 2 --backend cuda \
      --quantization mxfp4 --batches 1,8 --contexts 2048 --prefill 1024 --md "$OUT/ba_${which}$round.md" \
      > "$OUT/ba_${which}$round.log" 2>&1
    echo "---- $which$round rc=$?"; grep -iE "decode step|moe|attention" "$OUT/ba_${which}$round.md" | head -8
  done
done
t "trace replay"
TRACE_SESSIONS=${TRACE_SESSIONS:-12} TRACE_TURNS=${TRACE_TURNS:-5} TRACE_C=${TRACE_C:-6} OUT=$OUT/trace \
  timeout 400 bash "$P/gpu/trace.sh"
t done
