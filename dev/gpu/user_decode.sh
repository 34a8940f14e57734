#!/bin/bash
# Issue 17 "measure as a user would": the engine's own decode loop (`generate --batch B`) against the same
# batch served over HTTP (`serve` + `bench --max-concurrency B`), greedy and sampled (temperature 0.7), on
# GLM-4.5-Air truncated to 8 layers with MXFP4 experts; then the whole model single-stream and bench-model's
# decode step at batch 16 x 20k. Extra serve/generate flags (e.g. --cuda-graph, --kv-cache-dtype fp8_e4m3)
# come from $MX_FLAGS (bench-model's from $MX_BENCH_FLAGS); the label of the run from $MX_LABEL. Run by run_all.sh (needs its LD_LIBRARY_PATH).
set -u
# run_all.sh puts the payload's Debian libraries on LD_LIBRARY_PATH for mxserve; the image's curl breaks with them.
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin/mxserve"; AIR="$P/configs/air.json"
FLAGS=(${MX_FLAGS:-}); LABEL=${MX_LABEL:-default}
TOK=$P/tok; mkdir -p "$TOK"; [ -f "$TOK/tokenizer.json" ] || tar -xJf "$P/tok.tar.xz" -C "$TOK"
PORT=18123
serve_start() {  # args: log file, extra serve args...
  local log=$1; shift
  "$BIN" serve --config "$AIR" --synthetic-weights --quantization mxfp4 --backend cuda --tokenizer "$TOK" \
    --served-model-name air --port $PORT --kv-cache-memory 40GiB "${FLAGS[@]}" "$@" > "$log" 2>&1 &
  SPID=$!
  for i in $(seq 1 600); do
    [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200 ] && return 0
    kill -0 $SPID 2>/dev/null || { tail -20 "$log"; return 1; }
    sleep 0.5
  done
  return 1
}
serve_stop() { kill -TERM $SPID 2>/dev/null; wait $SPID 2>/dev/null; }
bench() {  # args: json, extra bench args...
  local j=$1; shift
  "$BIN" bench --base-url http://127.0.0.1:$PORT --model air --tokenizer "$TOK" --no-progress --endpoint completions \
    --output-json "$j" "$@" 2>&1 | grep -E "TPOT|ITL|TTFT|throughput|success|req/s" | head -12
}
echo "== [$LABEL] 8 layers: generate --batch 8 (the engine's own loop)"
timeout 120 "$BIN" generate --config "$AIR" --synthetic-weights --quantization mxfp4 --num-layers 8 --backend cuda \
  --batch 8 --prompt-len 512 --max-tokens 256 --ignore-eos "${FLAGS[@]}" > "$OUT/gen8_$LABEL.log" 2>&1
echo "rc=$?"; grep -iE "RESULT|graph" "$OUT/gen8_$LABEL.log" | tail -4
if [ -n "${MX_FLAGS:-}" ]; then  # the same loop without the extra flags, in the same run (eager / bf16 cache)
  timeout 120 "$BIN" generate --config "$AIR" --synthetic-weights --quantization mxfp4 --num-layers 8 --backend cuda \
    --batch 8 --prompt-len 512 --max-tokens 256 --ignore-eos > "$OUT/gen8_${LABEL}_noflags.log" 2>&1
  echo "without MX_FLAGS: rc=$?"; grep -E "RESULT" "$OUT/gen8_${LABEL}_noflags.log" | tail -2
fi
echo "== [$LABEL] 8 layers: serve + bench, 8 concurrent streams"
if serve_start "$OUT/serve8_$LABEL.log" --num-layers 8 --max-num-seqs 16 --max-model-len 4096; then
  for T in 0 0.7; do
    echo "-- temperature $T"
    bench "$OUT/bench8_t${T}_$LABEL.json" --workload random --input-len 512 --output-len 256 --max-concurrency 8 \
      --num-requests 24 --warmup-requests 8 --temperature $T
  done
  serve_stop
else echo "serve failed"; fi
if [[ " ${FLAGS[*]} " == *" --cuda-graph "* ]]; then  # default batch/context limits: capture time and memory
  echo "== [$LABEL] 8 layers, default --max-num-seqs / --max-model-len: start-up with graphs"
  if serve_start "$OUT/serve8_defaults_$LABEL.log" --num-layers 8; then serve_stop; echo "ready"; else echo "serve failed"; fi
  grep -iE "captured|graph|memory plan|KV cache" "$OUT/serve8_defaults_$LABEL.log" | cut -c1-300 | head -6
fi
echo "== [$LABEL] whole model (46 layers): serve + bench single stream 10k in / 512 out"
if serve_start "$OUT/serve46_$LABEL.log" --max-num-seqs 4 --max-model-len 12000; then
  bench "$OUT/bench46_single_$LABEL.json" --workload random --input-len 10000 --output-len 512 --max-concurrency 1 \
    --num-requests 3 --warmup-requests 1 --temperature 0
  serve_stop
else echo "serve failed"; fi
grep -iE "graph|kv cache|warn" "$OUT/serve46_$LABEL.log" | head -8
echo "== [$LABEL] bench-model: 2 layers, decode batch 16 at 20k context, whole step"
timeout 150 "$BIN" bench-model --config "$AIR" --synthetic-weights --num-layers 2 --backend cuda --quantization mxfp4 \
  --batches 16 --contexts 20480 --prefill 8192 --model-batches 1,16 ${MX_BENCH_FLAGS:-} \
  --md "$OUT/bench_model_$LABEL.md" > "$OUT/bench_model_$LABEL.log" 2>&1
echo "rc=$?"; cat "$OUT/bench_model_$LABEL.md" 2>/dev/null | head -40
