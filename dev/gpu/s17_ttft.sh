#!/bin/bash
# Session 17, issue 33: the seed's prefill through `serve` + `bench` with the bf16 and the FP8 E4M3 KV cache, one
# server each on the same GPU (whole GLM-4.5-Air, synthetic weights, MXFP4 experts; fits an H100): one prefix group,
# requests one at a time (--max-concurrency 1), 20k in / 16 out, 60% cached -- the first request (warmup, excluded)
# fills the prefix, the next $TTFT_N each prefill 8k new tokens over 12k cached, the seed's per-request prefill.
# TTFT p50 per cache dtype is that prefill (the FP8 one ran at 0.64-0.75x before session 17's dequantize-once pass).
set -u
. "$(dirname "$0")/payload_env.sh"
TOK=$P/tok; mkdir -p "$TOK"; [ -f "$TOK/tokenizer.json" ] || tar -xJf "$P/tok.tar.xz" -C "$TOK"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
PORT=18126; N=${TTFT_N:-4}
for KV in auto fp8_e4m3; do
  t "serve, --kv-cache-dtype $KV"
  "$B/mxserve" serve --config "$P/configs/air.json" --synthetic-weights --quantization mxfp4 --backend cuda \
    --tokenizer "$TOK" --served-model-name air --port $PORT --gpu-memory-utilization 0.9 --max-model-len 24000 \
    --kv-cache-dtype $KV > "$OUT/serve_$KV.log" 2>&1 &
  SPID=$!
  for i in $(seq 1 600); do
    [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200 ] && break
    kill -0 $SPID 2>/dev/null || { tail -20 "$OUT/serve_$KV.log"; break; }
    sleep 0.5
  done
  t "bench, $KV"
  "$B/mxserve" bench --base-url http://127.0.0.1:$PORT --model air --tokenizer "$TOK" --no-progress \
    --endpoint completions --workload shared-prefix --input-len 20000 --output-len 16 --cache-hit-rate 0.6 \
    --num-prefix-groups 1 --max-concurrency 1 --warmup-requests 1 --num-requests "$N" \
    --output-json "$OUT/ttft_$KV.json" 2>&1 | grep -iE "ttft|success|requests" | head -8
  kill -TERM $SPID; wait $SPID 2>/dev/null
  grep -iE "dequantize|prefill attention|activation reserve|kv cache:" "$OUT/serve_$KV.log" | cut -c1-300 | head -5
done
t done
