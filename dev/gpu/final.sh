#!/bin/bash
# One device call for a session's closing numbers (~7 minutes of GPU), from a payload (dev/make_gpu_payload.sh):
# phase 1 (functional, run side by side): the GPU tests the session touched, GLM-5.2 served over HTTP with and
# without MTP (glm5_serve.sh, one bench each), KV exhaustion + client disconnect (preempt_disconnect.sh);
# phase 2 (quiet GPU): whole GLM-4.5-Air single stream 10k in / 256 out (TTFT of a lone 10k prompt, TPOT);
# phase 3 (quiet GPU): the seed workload at $SEED_RATES
# (default 0.2) x $SEED_N (30) requests. Each part writes under $OUT as it finishes. Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin"; AIR="$P/configs/air.json"
TOK=$P/tok; mkdir -p "$TOK"; [ -f "$TOK/tokenizer.json" ] || tar -xJf "$P/tok.tar.xz" -C "$TOK"
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
t "phase 1: tests + glm5_serve + preempt_disconnect side by side"
for tst in test_cuda_attention_wgmma test_cuda_moe_mxfp4_wg test_cuda_graphs test_cuda_fixture; do
  ( [ -x "$BIN/$tst" ] || { echo "$tst: not in payload" >> "$OUT/tests_rc.txt"; exit 0; }
    timeout 160 "$BIN/$tst" > "$OUT/t_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/tests_rc.txt" ) &
done
( GLM5_RUNS="nomtp mtp" GLM5_C1_REQS=3 GLM5_C8_REQS=8 OUT=$OUT/glm5 timeout 170 bash "$P/gpu/glm5_serve.sh" > "$OUT/glm5_serve.txt" 2>&1 ) &
( OUT=$OUT/preempt timeout 150 bash "$P/gpu/preempt_disconnect.sh" > "$OUT/preempt_disconnect.txt" 2>&1 ) &
wait
pkill -TERM -f "[b]in/mxserve serve" 2>/dev/null; sleep 2  # a server left by a stage cut short (timeout does not reach it)
t "phase 1 done"; cat "$OUT/tests_rc.txt"; grep -E "^(PASS|FAIL)|failed checks|TPOT|tok/s" "$OUT/glm5_serve.txt" | cut -c1-200 | tail -24
grep -E "PASS|FAIL" "$OUT/preempt_disconnect.txt"
PORT=18127
serve_start() {
  local log=$1; shift
  "$BIN/mxserve" serve --config "$AIR" --synthetic-weights --quantization mxfp4 --backend cuda --tokenizer "$TOK" \
    --served-model-name air --port $PORT "$@" > "$log" 2>&1 &
  SPID=$!
  for i in $(seq 1 180); do
    [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200 ] && return 0
    kill -0 $SPID 2>/dev/null || { tail -20 "$log"; return 1; }
    sleep 0.5
  done; return 1
}
serve_stop() { kill -TERM $SPID 2>/dev/null; wait $SPID 2>/dev/null; }
bench() { local j=$1; shift
  "$BIN/mxserve" bench --base-url http://127.0.0.1:$PORT --model air --tokenizer "$TOK" --no-progress \
    --endpoint completions --output-json "$j" "$@" 2>&1 | grep -E "TPOT|TTFT|throughput|Success|^\|" | head -14; }
t "phase 2a: whole model single stream"
if serve_start "$OUT/serve46.log" --kv-cache-memory 40GiB --max-num-seqs 4 --max-model-len 12000; then
  bench "$OUT/single46.json" --workload random --input-len 10000 --output-len 256 --max-concurrency 1 \
    --num-requests 3 --warmup-requests 1 --temperature 0
  serve_stop
fi
t "phase 3: seed workload"
[ "${FINAL_SEED:-1}" = 1 ] && SEED_RATES=${SEED_RATES:-0.2} SEED_N=${SEED_N:-30} OUT=$OUT/seed timeout ${SEED_SECS:-240} bash "$P/gpu/seed.sh" 2>&1 | tail -14
t "done"
