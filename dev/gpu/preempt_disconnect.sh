#!/bin/bash
# Issue 17's reliability checks that the knee run does not reach: KV exhaustion and a client hanging up.
# GLM-4.5-Air truncated to 8 layers (MXFP4 experts) served with a 2 GiB KV pool (~65k tokens); 16 requests of
# 8,000 in / 512 out sent at once need ~136k tokens, so the scheduler must preempt and recompute: every request
# must still succeed (bench's success line, the preemption counter > 0). Then a streamed request with a unique
# ~6k-token prompt is cut by the client after 3 s: KV use must rise mid-stream, the aborted counter must rise, and
# KV use must fall back to its level before the request within 1 s of the hang-up.
# PASS/FAIL lines at the end. Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin/mxserve"; AIR="$P/configs/air.json"
TOK=$P/tok; mkdir -p "$TOK"; [ -f "$TOK/tokenizer.json" ] || tar -xJf "$P/tok.tar.xz" -C "$TOK"
PORT=18126; URL=http://127.0.0.1:$PORT
"$BIN" serve --config "$AIR" --synthetic-weights --quantization mxfp4 --num-layers 8 --backend cuda --tokenizer "$TOK" \
  --served-model-name air --port $PORT --kv-cache-memory 2GiB --max-model-len 16384 ${MX_FLAGS:-} \
  > "$OUT/serve_preempt.log" 2>&1 &
SPID=$!
for i in $(seq 1 600); do
  [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' $URL/health)" = 200 ] && break
  kill -0 $SPID 2>/dev/null || { tail -20 "$OUT/serve_preempt.log"; exit 1; }
  sleep 0.5
done
metric() { LD_LIBRARY_PATH= curl -s $URL/metrics | awk -v m="$1" '$1 ~ "^"m {print $2; exit}'; }
"$BIN" bench --base-url $URL --model air --tokenizer "$TOK" --no-progress --endpoint completions \
  --workload random --input-len 8000 --output-len 512 --request-rate inf --num-requests 16 \
  --output-json "$OUT/preempt.json" > "$OUT/preempt_bench.log" 2>&1
grep -E "Successful|Failed|Benchmark duration|TTFT|TPOT" "$OUT/preempt_bench.log" | head -8
PRE=$(metric vllm:num_preemptions_total); OK=$(grep -E "^\| inf" "$OUT/preempt_bench.log" | grep -c "100.0%")
echo "preemptions=$PRE"
[ "${PRE%.*}" -gt 0 ] 2>/dev/null && [ "$OK" = 1 ] && echo "PASS preemption: all 16 requests succeeded, $PRE preemptions" \
  || { echo "FAIL preemption (preemptions=$PRE, 100% success rows=$OK)"; grep -E "^\|" "$OUT/preempt_bench.log"; }
python3 -c '
import json, random
r = random.Random(11)
words = ["alpha","river","stone","cloud","amber","delta","forest","signal","copper","meadow"]
print(json.dumps({"model": "air", "prompt": " ".join(r.choice(words) for _ in range(6000)),
                  "max_tokens": 4000, "stream": True, "ignore_eos": True}))' > "$OUT/disconnect_req.json"
A0=$(metric mxserve:requests_aborted_total); K0=$(metric vllm:kv_cache_usage_perc)
LD_LIBRARY_PATH= curl -s -N --max-time 3 -H 'Content-Type: application/json' -d @"$OUT/disconnect_req.json" \
  -o "$OUT/disconnect_stream.txt" -w '%{http_code}' $URL/v1/completions > "$OUT/disconnect_code.txt" &
CPID=$!
sleep 2  # mid-stream: the request holds its blocks
KM=$(metric vllm:kv_cache_usage_perc); RM=$(metric vllm:num_requests_running)
wait $CPID; CRC=$?
sleep 1
A2=$(metric mxserve:requests_aborted_total); K2=$(metric vllm:kv_cache_usage_perc); R2=$(metric vllm:num_requests_running)
echo "disconnect: http=$(cat "$OUT/disconnect_code.txt") curl_rc=$CRC chunks=$(grep -c '^data:' "$OUT/disconnect_stream.txt")" \
     "aborted $A0 -> $A2, kv $K0 -> $KM (mid-stream, running $RM) -> $K2 (1 s after the hang-up, running $R2)"
# PASS: the request held blocks mid-stream, the hang-up counted as an abort, and KV use is back to where it was.
python3 -c "import sys; a0,a2,k0,km,k2=map(float,sys.argv[1:6]); sys.exit(0 if a2>a0 and km>k0 and k2<=k0+1e-9 else 1)" \
  "${A0:-0}" "${A2:-0}" "${K0:-0}" "${KM:-0}" "${K2:-1}" \
  && echo "PASS disconnect: aborted counter rose, KV use $KM mid-stream -> $K2 within 1 s of the hang-up" \
  || echo "FAIL disconnect"
kill -TERM $SPID; wait $SPID 2>/dev/null
grep -iE "error|warn" "$OUT/serve_preempt.log" | head -5
