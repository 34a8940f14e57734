#!/bin/bash
# Issue 17's seed workload on one H200: whole GLM-4.5-Air (46 layers, synthetic weights, MXFP4 experts) served,
# `mxserve bench` shared-prefix 20k in / 1k out / 60% cached, constant arrivals at $SEED_RATES (req/s, comma list,
# default 0.2), $SEED_N requests per point (30). Extra serve flags from $MX_FLAGS; $SEED_KV the KV pool (default
# 60GiB on a card of >= 120 GiB, the H200's earlier runs; else auto: an H100 has ~7 GiB beside Air's 62.7 GiB).
# Run by run_all.sh.
set -u
# --endpoint completions: the Qwen3 tokenizer stands in for GLM's; its chat template's special ids lie outside Air's vocabulary.
# run_all.sh puts the payload's Debian libraries on LD_LIBRARY_PATH for mxserve; the image's curl breaks with them.
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin/mxserve"; AIR="$P/configs/air.json"
if [ -z "${SEED_KV:-}" ]; then
  MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  if [ "${MIB:-0}" -ge 122880 ]; then SEED_KV=60GiB; else SEED_KV=auto; fi
fi
KV_FLAG="--kv-cache-memory $SEED_KV"; [ "$SEED_KV" = auto ] && KV_FLAG="--gpu-memory-utilization 0.9"  # auto: the device sizes it
echo "seed.sh: KV pool $SEED_KV"
FLAGS=(${MX_FLAGS:-}); RATES=${SEED_RATES-0.2}; N=${SEED_N:-30}
TOK=$P/tok; mkdir -p "$TOK"; [ -f "$TOK/tokenizer.json" ] || tar -xJf "$P/tok.tar.xz" -C "$TOK"
PORT=18124
"$BIN" serve --config "$AIR" --synthetic-weights --quantization mxfp4 --backend cuda --tokenizer "$TOK" \
  --served-model-name air --port $PORT $KV_FLAG --max-model-len 24000 "${FLAGS[@]}" \
  > "$OUT/serve_seed.log" 2>&1 &
SPID=$!
for i in $(seq 1 600); do
  [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200 ] && break
  kill -0 $SPID 2>/dev/null || { tail -20 "$OUT/serve_seed.log"; exit 1; }
  sleep 0.5
done
( while kill -0 $SPID 2>/dev/null; do
    echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader) rss_kib=$(awk '/VmRSS/{print $2}' /proc/$SPID/status)"
    sleep 5; done ) > "$OUT/memory_over_time.txt" 2>&1 &
# $SEED_SINGLE=N: first N single-stream requests of 10,000 in / 1,500 out on the same server (issue 33's
# single-stream target: plain decode, whole model).
if [ "${SEED_SINGLE:-0}" -gt 0 ]; then
  "$BIN" bench --base-url http://127.0.0.1:$PORT --model air --tokenizer "$TOK" --no-progress --endpoint completions \
    --workload random --input-len 10000 --output-len 1500 --max-concurrency 1 --num-requests "$SEED_SINGLE" \
    --output-json "$OUT/single.json" 2>&1 | tail -25
fi
# $SEED_KNEE=1: --find-knee over the $SEED_RATES grid (TTFT p95 <= 5 s, 100% success, no growing queue), no
# bisection unless $SEED_BISECT; $SEED_RATES empty: no shared-prefix run (single stream only).
KNEE=(); [ "${SEED_KNEE:-0}" = 1 ] && KNEE=(--find-knee --slo-ttft-p95 5s --min-success 1 --knee-max-bisections ${SEED_BISECT:-0})
[ -n "$RATES" ] && "$BIN" bench --base-url http://127.0.0.1:$PORT --model air --tokenizer "$TOK" --no-progress --endpoint completions "${KNEE[@]}" \
  --workload shared-prefix --input-len 20000 --output-len 1000 --cache-hit-rate 0.6 --num-prefix-groups 4 \
  --arrival constant --sweep "$RATES" --num-requests "$N" --gpus 1 --save-requests \
  --output-json "$OUT/seed.json" 2>&1 | tail -30
kill -TERM $SPID; wait $SPID 2>/dev/null
grep -iE "preempt|error|warn" "$OUT/serve_seed.log" | head -10
# The engine's own step-cost fit, for `mxserve simulate --step-cost` (docs/scheduling.md "Simulating the knee").
grep "step cost model" "$OUT/serve_seed.log" | tail -1 | cut -c1-400
tail -3 "$OUT/memory_over_time.txt"
