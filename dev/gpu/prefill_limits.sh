#!/bin/bash
# Issue 18's measured limits, one stage (~4 min): (1) Nsight Compute counters (full set, clocks left alone) of the
# two wgmma kernels -- the prefill attention kernel on the 8192-token chunk of bench_prefill_attention and the
# MXFP4 MoE wg_n128_s3 gate_up + down GEMMs at M = 8192 (GLM-4.5-Air) of bench_moe_mxfp4_wg -- the key lines
# extracted to ncu_summary.txt; (2) whole GLM-4.5-Air (46 layers, MXFP4, synthetic) served, TTFT of a lone 10k
# prompt and of a 20k prompt with 12k cached (ttft_prefix.py) at the prefill chunks in $CHUNKS (2048 16384);
# with MX_W4A8=1 also with --moe-activation-dtype fp8_e4m3 (and its start-up gate line). Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
BIN="$P/bin"; AIR="$P/configs/air.json"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
TOK=$P/tok; mkdir -p "$TOK"; [ -f "$TOK/tokenizer.json" ] || tar -xJf "$P/tok.tar.xz" -C "$TOK"
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
if [ "${SKIP_NCU:-0}" != 1 ]; then
  t "ncu: prefill attention (wgmma), 8192-token chunk"
  timeout 120 "$NCU" --clock-control none --set full -k regex:paged_attention_wgmma --launch-count 1 \
    "$BIN/bench_prefill_attention" --quick > "$OUT/ncu_attn.txt" 2>&1; echo "ncu attn rc=$?"
  t "ncu: MXFP4 MoE wg_n128_s3 at M=8192 (gate_up, down)"
  timeout 150 "$NCU" --clock-control none --set full --kernel-name-base demangled -k 'regex:mxfp4_wg_kernel<[^,]*128,' \
    --launch-count 2 "$BIN/bench_moe_mxfp4_wg" 8192 > "$OUT/ncu_moe.txt" 2>&1; echo "ncu moe rc=$?"
  for f in ncu_attn ncu_moe; do
    echo "== $f" ; grep -E "^  [a-z_]+.*\(|paged_attention_wgmma_kernel|mxfp4_wg_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc Active|No Eligible|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|Bank Conflicts|Stall|pipe|Tensor|est. speedup|One or More Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler" "$OUT/$f.txt" | head -90
  done > "$OUT/ncu_summary.txt"
  cat "$OUT/ncu_summary.txt" | head -120
fi
PORT=18128
serve_start() {
  local log=$1; shift
  "$BIN/mxserve" serve --config "$AIR" --synthetic-weights --quantization mxfp4 --backend cuda --tokenizer "$TOK" \
    --served-model-name air --port $PORT --kv-cache-memory 40GiB --max-model-len 24000 --max-num-seqs 8 "$@" > "$log" 2>&1 &
  SPID=$!
  for i in $(seq 1 240); do
    [ "$(LD_LIBRARY_PATH= curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200 ] && return 0
    kill -0 $SPID 2>/dev/null || { tail -20 "$log"; return 1; }
    sleep 0.5
  done; return 1
}
serve_stop() { kill -TERM $SPID 2>/dev/null; wait $SPID 2>/dev/null; }
run_case() {  # name, serve flags...
  local name=$1; shift
  t "serve $name: $*"
  if serve_start "$OUT/serve_$name.log" "$@"; then
    grep -E "W4A8|ACCURACY|FP8 path|MoE activations" "$OUT/serve_$name.log" | head -8
    env -u LD_LIBRARY_PATH python3 "$P/gpu/ttft_prefix.py" http://127.0.0.1:$PORT air ${TTFT_REPEATS:-3} 2>&1 | tee "$OUT/ttft_$name.txt"
    serve_stop
  else echo "serve $name failed to start"; fi
}
for c in ${CHUNKS:-2048 16384}; do
  run_case chunk$c --chunked-prefill-size $c --max-num-batched-tokens $c
done
if [ "${MX_W4A8:-0}" = 1 ]; then
  for c in ${W4A8_CHUNKS:-16384}; do
    run_case w4a8_chunk$c --chunked-prefill-size $c --max-num-batched-tokens $c --moe-activation-dtype fp8_e4m3
  done
fi
t "done"
