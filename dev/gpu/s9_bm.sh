#!/bin/bash
# Session 9: issue 33's decode-step row -- bench-model, GLM-4.5-Air 2 layers (dense + MoE), MXFP4 experts, batch 16
# at 20k context sharing a 12k prefix in groups of 4 -- with cascade attention (the default) and without, bf16 and
# FP8 KV caches. One line per variant: the model step's time and its fraction of the roofline on must-read bytes.
set -u
. "$(dirname "$0")/payload_env.sh"
for kv in auto fp8_e4m3; do
  for casc in on off; do
    extra=(); [ $casc = off ] && extra=(--disable-cascade-attention)
    log="$OUT/bm_${kv}_${casc}.log"
    timeout 150 "$B/mxserve" bench-model --config "$P/configs/air.json" --synthetic-weights --quantization mxfp4 \
      --backend cuda --num-layers 2 --batches 16 --contexts 20000 --prefill 1024 --model-batches 16 \
      --shared-prefix 12000 --prefix-group 4 --kv-cache-dtype $kv "${extra[@]}" --md "$OUT/bm_${kv}_${casc}.md" > "$log" 2>&1
    echo "== kv $kv cascade $casc rc=$?"; grep -iE "step|roofline|cascade" "$OUT/bm_${kv}_${casc}.md" | head -8
  done
done
