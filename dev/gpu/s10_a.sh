#!/bin/bash
# Session 10, call A (any card): (1) issue 32's seed layout at the DEFAULT --gpu-memory-utilization (GLM-5.2 8 layers
# MXFP4, TP4 x DP2 + DP attention + MTP + FP8 KV on the shared-device stand-in; s7_seed.sh without SEED_KV);
# (2) issue 33's decode-step row (bench-model, the step now samples on the device as the engine does: no f32 logits
# download) at 2 and 8 layers, bf16 / FP8 KV, cascade on / off; (3) the fused all-reduce split at tp 2, three
# interleaved repeats of each variant (eager and graphs), so the bound is compared with the spread.
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"
PART=${1:-all}  # 1: the seed layout, 2: the rope_kv_write checks, 3: the decode-step rows, 4: the all-reduce split
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ $PART = all ] || [ $PART = 1 ]; then
t "(1) seed layout, default --gpu-memory-utilization 0.9"
unset SEED_KV; SEED_UTIL=0.9 OUT=$OUT/seed timeout 200 bash "$P/gpu/s7_seed.sh"
grep -E "dry run|reserve|device memory|KV cache|released|recovered|out of memory" "$OUT/seed/seed_serve.log" | cut -c1-300 | head -14
fi
if [ $PART = all ] || [ $PART = 2 ]; then
t "(1b) the fused RoPE + K/V write (h10/qkvrope): oracle, graphs, fixtures with MXSERVE_FUSED_ROPE_KV=1"
for v in 1; do MXSERVE_FUSED_ROPE_KV=$v timeout 100 "$B/test_cuda_rope_kv_write" --gtest_color=no > "$OUT/rkv_$v.log" 2>&1; echo "rope_kv_write =$v rc=$?"; done
MXSERVE_FUSED_ROPE_KV=1 timeout 60 "$B/test_cuda_graphs" --gtest_color=no --gtest_filter='Fixtures/*' > "$OUT/graphs_rkv1.log" 2>&1; echo "graphs =1 rc=$?"
MXSERVE_FUSED_ROPE_KV=1 timeout 50 "$B/test_cuda_fixture" --gtest_color=no > "$OUT/fixture_rkv1.log" 2>&1; echo "fixture =1 rc=$?"
for f in rkv_1 graphs_rkv1 fixture_rkv1; do echo "-- $f"; grep -E "^\[  (FAILED|PASSED) |Failure|RoPE \+ K/V" "$OUT/$f.log" | head -6; done
fi
if [ $PART = all ] || [ $PART = 3 ]; then
t "(2) bench-model decode-step rows (eager and graph rows)"
for spec in 2:auto:on 2:auto:rkv 8:auto:on 2:fp8_e4m3:on 2:auto:off; do
  IFS=: read L kv casc <<< "$spec"
  extra=(); [ $casc = off ] && extra=(--disable-cascade-attention)
  tag=L${L}_${kv}_${casc}
  RKV=(); [ $casc = rkv ] && RKV=(MXSERVE_FUSED_ROPE_KV=1)
  env "${RKV[@]}" timeout 100 "$B/mxserve" bench-model --config "$P/configs/air.json" --synthetic-weights --quantization mxfp4 \
    --backend cuda --num-layers $L --batches 16 --contexts 20000 --prefill 1024 --model-batches 16 \
    --shared-prefix 12000 --prefix-group 4 --kv-cache-dtype $kv "${extra[@]}" --md "$OUT/bm_$tag.md" > "$OUT/bm_$tag.log" 2>&1
  echo "== layers $L kv $kv cascade $casc rc=$?"; grep -E "decode step|b=16" "$OUT/bm_$tag.md" | cut -c1-400 | tail -4; grep -E "captured|cascade attention kernel|error" "$OUT/bm_$tag.log" | head -3
done
fi
if [ $PART = all ] || [ $PART = 4 ]; then
t "(3) fused all-reduce split, 2 interleaved repeats"
step() {  # LABEL ARGS...
  local label=$1; shift; local log="$OUT/ar_$(echo "$label" | tr ' ' _).log"
  timeout 120 "$B/mxserve" generate --config "$P/configs/air.json" --synthetic-weights --num-layers 4 \
    --backend cuda --batch 8 --prompt-len 64 --max-tokens 256 --ignore-eos "$@" > "$log" 2>&1
  python3 - "$log" "$label" <<'PY'
import json, sys
rs = [json.loads(l[7:]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
if not rs: print("TIME %s: no RESULT line" % sys.argv[2]); sys.exit()
r = rs[-1]
print("TIME %s: decode %.4f ms/step" % (sys.argv[2], 1000.0 * r["batch"] / max(r["decode_tok_s"], 1e-9)))
PY
}
for rep in 1 2; do
  step "tp1 eager" --disable-cuda-graph
  step "tp2 unfused eager" --tp-size 2 --communicator shared-device --disable-custom-all-reduce --disable-cuda-graph
  step "tp2 fused eager" --tp-size 2 --communicator shared-device --disable-cuda-graph
  step "tp1 graphs"
  step "tp2 fused graphs" --tp-size 2 --communicator shared-device
done 2>&1 | tee "$OUT/ar_times.txt"
[ -x "$B/bench_standin_collectives" ] && timeout 100 "$B/bench_standin_collectives" 4096 151552 200 > "$OUT/ar_collectives.log" 2>&1
tail -8 "$OUT/ar_collectives.log"
fi
t done
