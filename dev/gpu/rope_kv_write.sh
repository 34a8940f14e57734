#!/bin/bash
# The fused RoPE + K/V cache write and one QKV GEMM at every row count on the GPU (issue 33 item 3;
# docs/perf/decode-path.md), from a payload folder made by dev/make_gpu_payload.sh. Writes to $OUT (or
# /tmp/mxserve_gpu): rkv_{default,1,0}.log (test_cuda_rope_kv_write with MXSERVE_FUSED_ROPE_KV unset / =1 / =0: the
# fused kernel and the backend op == rope + rope + kv_write bit for bit, bf16 and FP8 caches, and the CPU within
# tolerance), graphs_{1,0}.log (test_cuda_graphs Fixtures: graphs == eager with each path), fixture_{1,0}.log
# (test_cuda_fixture: the glm4_moe fixtures within their tolerances, the one QKV GEMM at T > 1 included),
# bench_{0,1}.log (bench-model on Air, 2 layers, each path: the attention layer at decode batch 1 / 16 and the
# prefill chunks), summary.txt. Budget: ~5 minutes on an H100 / H200.
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"

timeout 120 "$B/test_cuda_rope_kv_write" --gtest_color=no > "$OUT/rkv_default.log" 2>&1; RC_D=$?
MXSERVE_FUSED_ROPE_KV=1 timeout 120 "$B/test_cuda_rope_kv_write" --gtest_color=no > "$OUT/rkv_1.log" 2>&1; RC_1=$?
MXSERVE_FUSED_ROPE_KV=0 timeout 120 "$B/test_cuda_rope_kv_write" --gtest_color=no > "$OUT/rkv_0.log" 2>&1; RC_0=$?
for v in 1 0; do
  MXSERVE_FUSED_ROPE_KV=$v timeout 240 "$B/test_cuda_graphs" --gtest_color=no --gtest_filter='Fixtures/*' \
    > "$OUT/graphs_$v.log" 2>&1; eval RC_G$v=\$?
  MXSERVE_FUSED_ROPE_KV=$v timeout 240 "$B/test_cuda_fixture" --gtest_color=no > "$OUT/fixture_$v.log" 2>&1
  eval RC_F$v=\$?
done
for v in 0 1; do
  MXSERVE_FUSED_ROPE_KV=$v timeout 150 "$B/mxserve" bench-model --config "$P/configs/air.json" --synthetic-weights \
    --num-layers 2 --backend cuda --quantization mxfp4 --batches 1,16 --contexts 2048 --prefill 1024,8192 \
    --model-batches 1,16 > "$OUT/bench_$v.log" 2>&1; eval RC_B$v=\$?
done
{
  echo "==== summary ===="
  echo "test_cuda_rope_kv_write rc unset=$RC_D =1:$RC_1 =0:$RC_0   graphs =1:$RC_G1 =0:$RC_G0" \
       "  fixture =1:$RC_F1 =0:$RC_F0   bench =0:$RC_B0 =1:$RC_B1"
  for f in rkv_default rkv_1 rkv_0; do
    echo "---- $f"; grep -E "RoPE \+ K/V|^\[  (     OK|FAILED |SKIPPED) \]|Failure|differ|\[ err" "$OUT/$f.log" | head -40
  done
  for f in graphs_1 graphs_0 fixture_1 fixture_0; do echo "---- $f"; grep -E "FAILED|PASSED|RoPE \+ K/V" "$OUT/$f.log" | head -8; done
  for f in bench_0 bench_1; do echo "---- $f"; grep -E "RoPE \+ K/V|one fused GEMM|attention|decode|prefill|error" "$OUT/$f.log" | head -40; done
} | tee "$OUT/summary.txt"
