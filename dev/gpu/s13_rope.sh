#!/bin/bash
# Session 13 (a short call): the fused RoPE + K/V write A/B at batch 1 and an 8k prefill chunk (8 layers of
# GLM-4.5-Air, MXFP4, bench-model), MXSERVE_FUSED_ROPE_KV=0 vs the default, interleaved twice.
set -u
. "$(dirname "$0")/payload_env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for v in 0 default 0 default; do
  RKV=(); [ $v = 0 ] && RKV=(MXSERVE_FUSED_ROPE_KV=0)
  env "${RKV[@]}" timeout 60 "$B/mxserve" bench-model --config "$P/configs/air.json" --synthetic-weights --quantization mxfp4 \
    --backend cuda --num-layers 8 --batches 1 --contexts 4096 --prefill 8192 --model-batches 1 \
    --md "$OUT/bm_rkv_$v.md" > "$OUT/bm_rkv_$v.log" 2>&1
  echo "== MXSERVE_FUSED_ROPE_KV=$v rc=$?"; grep -vE "^\s*$" "$OUT/bm_rkv_$v.md" | cut -c1-260 | tail -8
done
t done
