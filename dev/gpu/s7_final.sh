#!/bin/bash
# Session 7, last call: (1) correctness after the last merges side by side -- MTP verify / draft steps in CUDA graphs
# (test_cuda_graphs, verify-fixture's graphs + MTP check on every fixture), the wgmma MLA kernel as the default
# (test_cuda_mla_dsa, test_cuda_fixture), the parallel layouts on the stand-in; (2) GLM-5.2 (8 layers, MXFP4,
# synthetic) bench-model and served, the session's first binary vs this one; MTP with simulated acceptance 2.5;
# (3) the seed's layout as one command on the one-GPU stand-in (issue 32): GLM-5.2 geometry at TP4 x DP2 + DP
# attention + MTP + FP8 KV, `mxserve bench` shared-prefix at 8 concurrent streams.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd) MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
: > "$OUT/rc.txt"
for tst in test_cuda_graphs test_cuda_mla_dsa test_cuda_fixture test_cuda_shared_device_comm; do
  ( timeout 150 "$B/$tst" --gtest_color=no > "$OUT/t_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/rc.txt" ) &
done
( timeout 150 "$B/test_cuda_parallel_layouts" --gtest_color=no --gtest_filter='-*Fused*' > "$OUT/t_layouts.log" 2>&1
  echo "test_cuda_parallel_layouts (not the fused test) rc=$?" >> "$OUT/rc.txt" ) &
( for fx in glm_moe_dsa_tiny_a glm_moe_dsa_tiny_b glm4_moe_tiny_a glm4_moe_tiny_b; do
    timeout 100 "$B/mxserve" verify-fixture "$P/fixtures/$fx" --backend cuda --max-rel-l2 2e-2 > "$OUT/vf_$fx.log" 2>&1
    echo "verify-fixture $fx rc=$?" >> "$OUT/rc.txt"; done ) &
wait; sort "$OUT/rc.txt"
for f in "$OUT"/t_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK' $f) ok"; grep -E "^\[  FAILED" "$f" | head -5; done
grep -hE "replays|cuda graphs|failed checks" "$OUT"/vf_*.log "$OUT/t_test_cuda_graphs.log" | cut -c1-200 | head -24
t "GLM-5.2 before / after"
OUT=$OUT/glm5 S7_PARTS="bench serve" timeout 200 bash "$P/gpu/s7_glm5.sh" 2>&1 | grep -vE "^\| (attention|moe) \| prefill" | cut -c1-200
t "GLM-5.2 MTP (simulated acceptance 2.5), graphs on"
GLM5_BIN="$B/mxserve" GLM5_RUNS=mtpsim GLM5_C1_REQS=3 GLM5_C8_REQS=8 OUT="$OUT/mtpsim" timeout 120 \
  bash "$P/gpu/glm5_serve.sh" 2>&1 | grep -E "PASS|FAIL|c=[18]:|CUDA graphs" | cut -c1-200
t "seed layout on the stand-in"
TOK=$P/tok; [ -f "$TOK/tokenizer.json" ] || { mkdir -p "$TOK" && tar -xJf "$P/tok.tar.xz" -C "$TOK"; }
"$B/mxserve" serve --config "$P/configs/glm52.json" --synthetic-weights --num-layers ${SEED_LAYERS:-4} --backend cuda \
  --tp-size 4 --dp-size 2 --enable-dp-attention --speculative-algorithm mtp --kv-cache-dtype fp8_e4m3 \
  --communicator shared-device --tokenizer "$TOK" --served-model-name glm5 --port 18126 --kv-cache-memory ${SEED_KV:-1GiB} \
  --max-model-len 8192 --max-num-seqs 16 --stats-interval 0 ${SEED_EXTRA:-} > "$OUT/seed_serve.log" 2>&1 &
SPID=$!
ok=0; for i in $(seq 1 360); do
  [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18126/health)" = 200 ] && { ok=1; break; }
  kill -0 $SPID 2>/dev/null || break; sleep 0.5; done
t "seed serve healthy=$ok"; grep -E "rank|shared-device|weights|KV cache|speculative|fp8|graphs|WARN|\[W |rror" "$OUT/seed_serve.log" | cut -c1-220 | head -16
if [ $ok = 1 ]; then
  "$B/mxserve" bench --base-url http://127.0.0.1:18126 --model glm5 --tokenizer "$TOK" --no-progress --endpoint completions \
    --workload shared-prefix --input-len ${SEED_IN:-2000} --output-len 64 --cache-hit-rate 0.6 --num-prefix-groups 2 \
    --max-concurrency 8 --num-requests 16 --temperature 0 --output-json "$OUT/seed_bench.json" > "$OUT/seed_bench.txt" 2>&1
  echo "seed bench rc=$?"; grep -E "Success rate|Requests|TPOT|TTFT|throughput|acceptance|cached" "$OUT/seed_bench.txt" | head -14
fi
kill -TERM $SPID 2>/dev/null; wait $SPID 2>/dev/null
t done
