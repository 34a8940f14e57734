#!/bin/bash
# Issue 33 item 3 (sampling inside the decode graphs, runtime/graph_sampler.h): served TPOT with the sampler
# inside the decode graphs (default) and after the replay (MXSERVE_GRAPH_SAMPLING=0), same binary, alternated
# twice: GLM-4.5-Air truncated to $GS_LAYERS (8) layers, synthetic MXFP4 experts, 8 concurrent streams of
# 512 in / 256 out, sampled (temperature 0.7, top_p 0.95, repetition_penalty 1.1, logprobs 2) and greedy.
# Prints one "[mode sampling] Mean TPOT ..." line per bench and the start-up lines of the tail.
# Env: MXSERVE_PAYLOAD (payload root: bin/mxserve, configs/air.json, tok.tar.xz), GS_BIN, GS_CONFIG, GS_TOK.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN=${GS_BIN:-$P/bin/mxserve}; CFG=${GS_CONFIG:-$P/configs/air.json}; LAYERS=${GS_LAYERS:-8}
TOK=${GS_TOK:-$P/tok}
[ -f "$TOK/tokenizer.json" ] || { mkdir -p "$TOK" && tar -xJf "$P/tok.tar.xz" -C "$TOK"; }
PORT=18127; BASE=http://127.0.0.1:$PORT
run() {  # mode (inside|after)
  local env=1; [ "$1" = after ] && env=0
  MXSERVE_GRAPH_SAMPLING=$env "$BIN" serve --config "$CFG" --synthetic-weights --num-layers "$LAYERS" \
    --quantization mxfp4 --backend cuda --tokenizer "$TOK" --served-model-name air --port $PORT \
    --kv-cache-memory 8GiB --max-model-len 2048 --max-num-seqs 16 --stats-interval 0 > "$OUT/gs_$1.log" 2>&1 &
  local spid=$!
  for i in $(seq 1 600); do
    [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' $BASE/health)" = 200 ] && break
    kill -0 $spid 2>/dev/null || { echo "serve ($1) died"; tail -20 "$OUT/gs_$1.log"; return 1; }
    sleep 0.5
  done
  grep -E "sampling inside|sampling runs after|captured" "$OUT/gs_$1.log" | cut -c1-260
  for s in sampled greedy; do
    local extra=(--temperature 0)
    [ $s = sampled ] && extra=(--temperature 0.7 --extra-body '{"top_p":0.95,"repetition_penalty":1.1,"logprobs":2}')
    "$BIN" bench --base-url $BASE --model air --tokenizer "$TOK" --no-progress --endpoint completions \
      --workload random --input-len 512 --output-len 256 --max-concurrency 8 --num-requests 24 \
      --warmup-requests 2 "${extra[@]}" > "$OUT/gs_$1_$s.txt" 2>&1
    echo "[$1 $s] rc=$? $(grep -E 'Mean TPOT' "$OUT/gs_$1_$s.txt" | head -1) | \
$(grep -E 'Success rate' "$OUT/gs_$1_$s.txt" | tail -1)"
  done
  grep -E "sampling runs after the replay" "$OUT/gs_$1.log" | cut -c1-260
  kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
}
for round in 1 2; do run after; run inside; done
