#!/bin/bash
# Issue 34 item 4's measurement: agentic trace replay against whole GLM-4.5-Air (46 layers, synthetic weights,
# MXFP4 experts) on one H200, with the host KV tier off and on. `mxserve bench trace-gen` writes the trace
# ($TRACE_SESSIONS sessions x $TRACE_TURNS turns, 6000 first-turn tokens, 1200 per later turn, 300 out, 2 s think
# time, context capped at 22000), then `mxserve bench --workload trace` replays it with $TRACE_C sessions at once,
# once per serve configuration: "off" (the GPU pool only) and "on" (+ $HOST_TIER_FLAGS, default
# --kv-cache-host-memory 2x the pool). The GPU pool is kept small ($POOL) so the sessions' contexts overflow it and
# the host tier matters. Extra serve flags from $MX_FLAGS. Run by run_all.sh (stage name "trace").
set -u
# --endpoint completions: the Qwen3 tokenizer stands in for GLM's (as seed.sh).
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin/mxserve"; AIR="$P/configs/air.json"
FLAGS=(${MX_FLAGS:-}); POOL=${POOL:-16GiB}; HOST=${HOST_TIER_FLAGS:---kv-cache-host-memory 32GiB}
S=${TRACE_SESSIONS:-32}; T=${TRACE_TURNS:-8}; C=${TRACE_C:-8}
TOK=$P/tok; mkdir -p "$TOK"; [ -f "$TOK/tokenizer.json" ] || tar -xJf "$P/tok.tar.xz" -C "$TOK"
PORT=18125
"$BIN" bench trace-gen --sessions "$S" --turns "$T" --first-turn-tokens 6000 --turn-tokens 1200 --output-tokens 300 \
  --think-time-s 2 --spread 0.3 --max-context 22000 --seed 34 --output "$OUT/agent_trace.jsonl" || exit 1
for tier in off on; do
  EXTRA=(); [ $tier = on ] && EXTRA=($HOST)
  "$BIN" serve --config "$AIR" --synthetic-weights --quantization mxfp4 --backend cuda --tokenizer "$TOK" \
    --served-model-name air --port $PORT --kv-cache-memory "$POOL" --max-model-len 24000 "${FLAGS[@]}" "${EXTRA[@]}" \
    > "$OUT/serve_trace_$tier.log" 2>&1 &
  SPID=$!
  for i in $(seq 1 600); do
    [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200 ] && break
    kill -0 $SPID 2>/dev/null || { echo "serve ($tier) exited:"; tail -20 "$OUT/serve_trace_$tier.log"; continue 2; }
    sleep 0.5
  done
  echo "=== host tier $tier: serve --kv-cache-memory $POOL ${EXTRA[*]} ${FLAGS[*]}"
  "$BIN" bench --base-url http://127.0.0.1:$PORT --model air --tokenizer "$TOK" --no-progress --endpoint completions \
    --workload trace --trace "$OUT/agent_trace.jsonl" --max-concurrency "$C" --gpus 1 --save-requests \
    --output-json "$OUT/trace_$tier.json" 2>&1 | sed -n '/Agent Trace Result/,$p'
  kill -TERM $SPID; wait $SPID 2>/dev/null
  grep -iE "preempt|error|warn|host" "$OUT/serve_trace_$tier.log" | head -10
done
