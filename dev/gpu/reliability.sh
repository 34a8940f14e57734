#!/bin/bash
# Issue 17's reliability run: the seed workload (whole GLM-4.5-Air, synthetic weights, MXFP4 experts, shared-prefix
# 20k in / 1k out / 60% cached) at a constant $REL_RATE req/s (default 0.1, the knee) for $REL_N requests (default
# 60 = 10 minutes of arrivals), with a KV pool small enough ($REL_KV, default 30GiB) that a burst exhausts it and
# preemption must recover. Meanwhile: GPU memory and server RSS every 5 s (memory_over_time.txt), the server's
# /metrics every 30 s (metrics_over_time.txt), and at ~120 s a client that streams a long unique prompt and hangs
# up after 5 s (disconnect.txt: the aborted counter and KV use before / after). Run by run_all.sh; long enough
# that the lead starts it with setsid and collects it in a later device call.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin/mxserve"; AIR="$P/configs/air.json"
FLAGS=(${MX_FLAGS:-}); RATE=${REL_RATE:-0.1}; N=${REL_N:-60}; KV=${REL_KV:-24GiB}
TOK=$P/tok; mkdir -p "$TOK"; [ -f "$TOK/tokenizer.json" ] || tar -xJf "$P/tok.tar.xz" -C "$TOK"
PORT=18125; URL=http://127.0.0.1:$PORT
"$BIN" serve --config "$AIR" --synthetic-weights --quantization mxfp4 --backend cuda --tokenizer "$TOK" \
  --served-model-name air --port $PORT --kv-cache-memory "$KV" --max-model-len 24000 "${FLAGS[@]}" \
  > "$OUT/serve_reliability.log" 2>&1 &
SPID=$!
for i in $(seq 1 600); do
  [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' $URL/health)" = 200 ] && break
  kill -0 $SPID 2>/dev/null || { tail -20 "$OUT/serve_reliability.log"; exit 1; }
  sleep 0.5
done
metric() { LD_LIBRARY_PATH= curl -s $URL/metrics | awk -v m="$1" '$1 ~ "^"m {print $2; exit}'; }
( while kill -0 $SPID 2>/dev/null; do
    echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader) rss_kib=$(awk '/VmRSS/{print $2}' /proc/$SPID/status)"
    sleep 5; done ) > "$OUT/memory_over_time.txt" 2>&1 &
( while kill -0 $SPID 2>/dev/null; do
    echo "$(date +%s) running=$(metric vllm:num_requests_running) waiting=$(metric vllm:num_requests_waiting)" \
         "kv=$(metric vllm:kv_cache_usage_perc) preempt=$(metric vllm:num_preemptions_total)" \
         "aborted=$(metric mxserve:requests_aborted_total) gen=$(metric vllm:generation_tokens_total)"
    sleep 30; done ) > "$OUT/metrics_over_time.txt" 2>&1 &
( sleep 120
  python3 -c '
import json, random
r = random.Random(7)
words = ["alpha","river","stone","cloud","amber","delta","forest","signal","copper","meadow"]
print(json.dumps({"model": "air", "prompt": " ".join(r.choice(words) + str(r.randrange(1000)) for _ in range(7000)),
                  "max_tokens": 1000, "stream": True, "ignore_eos": True}))' > /tmp/mx_disconnect.json
  {
    echo "before: aborted=$(metric mxserve:requests_aborted_total) kv=$(metric vllm:kv_cache_usage_perc) running=$(metric vllm:num_requests_running)"
    LD_LIBRARY_PATH= curl -s -N --max-time 5 -H 'Content-Type: application/json' -d @/tmp/mx_disconnect.json \
      $URL/v1/completions > /dev/null; echo "curl rc=$? (28 = timed out on purpose)"
    for s in 1 2 3; do sleep 1
      echo "+${s}s: aborted=$(metric mxserve:requests_aborted_total) kv=$(metric vllm:kv_cache_usage_perc) running=$(metric vllm:num_requests_running)"
    done
  } > "$OUT/disconnect.txt" 2>&1 ) &
"$BIN" bench --base-url $URL --model air --tokenizer "$TOK" --no-progress --endpoint completions \
  --workload shared-prefix --input-len 20000 --output-len 1000 --cache-hit-rate 0.6 --num-prefix-groups 4 \
  --arrival constant --request-rate "$RATE" --num-requests "$N" --gpus 1 --save-requests \
  --output-json "$OUT/reliability.json" 2>&1 | tail -30
echo "final: $(metric vllm:num_requests_running) running, preemptions $(metric vllm:num_preemptions_total), aborted $(metric mxserve:requests_aborted_total)"
kill -TERM $SPID; wait $SPID 2>/dev/null
grep -iE "preempt|error|warn" "$OUT/serve_reliability.log" | head -10
cat "$OUT/disconnect.txt"
head -2 "$OUT/memory_over_time.txt"; tail -2 "$OUT/memory_over_time.txt"
