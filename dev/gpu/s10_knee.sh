#!/bin/bash
# Session 10, issue 33 on an H200: (1) 8 layers at batch 1 (the llama.cpp comparison's geometry, graphs on) and
# (2) the whole GLM-4.5-Air seed server: one single-stream 10k / 1.5k request, then `bench --find-knee` over
# $SEED_RATES (default 0.2,0.3; 30 requests a point) with the KV cache dtype $KV (auto = bf16 | fp8_e4m3).
set -u
. "$(dirname "$0")/payload_env.sh"
KV=${KV:-auto}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "${SKIP_8L:-0}" != 1 ]; then
  t "(1) 8 layers, batch 1, graphs"
  timeout 100 "$B/mxserve" generate --config "$P/configs/air.json" --synthetic-weights --quantization mxfp4 --num-layers 8 \
    --backend cuda --prompt-len 512 --max-tokens 256 --ignore-eos --runs "b=1" > "$OUT/gen8_b1.log" 2>&1
  echo "rc=$?"; grep -E "RESULT" "$OUT/gen8_b1.log" | cut -c1-300 | tail -2
fi
t "(2) whole Air, KV $KV"
SEED_SINGLE=${SEED_SINGLE:-1} SEED_KNEE=1 SEED_RATES=${SEED_RATES:-0.2,0.3} SEED_N=${SEED_N:-30} \
  MX_FLAGS="--kv-cache-dtype $KV ${MX_FLAGS:-}" OUT=$OUT/seed bash "$P/gpu/seed.sh"
t done
