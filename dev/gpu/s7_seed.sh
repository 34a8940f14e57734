#!/bin/bash
# Session 7: the seed layout on the one-GPU stand-in alone (the tail of s7_final.sh; --kv-cache-memory is per rank).
# Session 8 defaults: GLM-5.2 8 layers with MXFP4 experts sliced per rank (SEED_LAYERS, SEED_QUANT), the KV pool
# sized at start-up from SEED_UTIL (--gpu-memory-utilization, split among the 8 ranks sharing the GPU after the
# weights and the measured forward peak); SEED_KV=SIZE passes --kv-cache-memory SIZE (per rank) instead.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
t "seed layout on the stand-in"
TOK=$P/tok; [ -f "$TOK/tokenizer.json" ] || { mkdir -p "$TOK" && tar -xJf "$P/tok.tar.xz" -C "$TOK"; }
if [ -n "${SEED_KV:-}" ]; then KVFLAG="--kv-cache-memory $SEED_KV"; else KVFLAG="--gpu-memory-utilization ${SEED_UTIL:-0.9}"; fi
"$B/mxserve" serve --config "$P/configs/glm52.json" --synthetic-weights --num-layers ${SEED_LAYERS:-8} \
  --quantization ${SEED_QUANT:-mxfp4} --backend cuda \
  --tp-size 4 --dp-size 2 --enable-dp-attention --speculative-algorithm mtp --kv-cache-dtype fp8_e4m3 \
  --communicator shared-device --tokenizer "$TOK" --served-model-name glm5 --port 18126 $KVFLAG \
  --max-model-len 8192 --max-num-seqs 16 --stats-interval 0 ${SEED_EXTRA:-} > "$OUT/seed_serve.log" 2>&1 &
SPID=$!
ok=0; for i in $(seq 1 360); do
  [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18126/health)" = 200 ] && { ok=1; break; }
  kill -0 $SPID 2>/dev/null || break; sleep 0.5; done
t "seed serve healthy=$ok"; grep -E "rank|shared-device|weights|KV cache|device memory|speculative|fp8|graphs|WARN|\[W |rror" "$OUT/seed_serve.log" | cut -c1-260 | head -40
if [ $ok = 1 ]; then
  "$B/mxserve" bench --base-url http://127.0.0.1:18126 --model glm5 --tokenizer "$TOK" --no-progress --endpoint completions \
    --workload shared-prefix --input-len ${SEED_IN:-2000} --output-len 64 --cache-hit-rate 0.6 --num-prefix-groups 2 \
    --max-concurrency 8 --num-requests 16 --temperature 0 --output-json "$OUT/seed_bench.json" > "$OUT/seed_bench.txt" 2>&1
  echo "seed bench rc=$?"; grep -E "Success rate|Requests|TPOT|TTFT|throughput|acceptance|cached" "$OUT/seed_bench.txt" | head -14
  # Alive = not a zombie (a server that aborted stays in the process table until this shell waits for it, and
  # kill -0 succeeds on it: session 13's check said "alive" after an abort) and /health answers 200.
  st=$(awk '/^State:/{print $2}' /proc/$SPID/status 2>/dev/null)
  hc=$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18126/health)
  if [ -n "$st" ] && [ "$st" != Z ] && [ "$hc" = 200 ]; then echo "seed server alive after the bench"
  else echo "seed server DIED during the bench (state ${st:-gone}, /health ${hc:-none})"; fi
  grep -E "forward failed|out of memory" "$OUT/seed_serve.log" | cut -c1-300 | head -5
fi
kill -TERM $SPID 2>/dev/null; wait $SPID 2>/dev/null
t done
