#!/bin/bash
# FP8 E4M3 KV cache on the GPU (docs/kv-cache.md), from a payload folder made by dev/make_gpu_payload.sh.
# Writes to $OUT (or /tmp/mxserve_gpu): kv_fp8_ops.log (test_cuda_kv_fp8: kv_write bytes == CPU, kv_copy, every
# attention kernel on the FP8 cache vs the CPU reference), cuda_ops.log (test_cuda_ops: the bf16 paths the
# change touched), kv_fp8_long.{log,json} (eval compare bf16 vs FP8 cache, synthetic GLM-4.5-Air geometry,
# 4 layers, one 20k-token window), bench_model_kv_{bf16,fp8}.{log,md} (attention layer and decode-step
# timing at 2k / 20k contexts), summary.txt. Budget: ~6 minutes on an H200.
set -u
. "$(dirname "$0")/payload_env.sh"
AIR="$P/configs/air.json"

timeout 180 "$P/bin/test_cuda_kv_fp8" --gtest_color=no > "$OUT/kv_fp8_ops.log" 2>&1
RC_OPS=$?
timeout 180 "$P/bin/test_cuda_ops" --gtest_color=no > "$OUT/cuda_ops.log" 2>&1
RC_CUDA_OPS=$?
timeout 300 "$P/bin/mxserve" eval compare --model "$AIR" --synthetic-weights --num-layers 4 --random-tokens 20480 \
  --window 20480 --backend cuda --kv-cache-dtype fp8_e4m3 --json "$OUT/kv_fp8_long.json" > "$OUT/kv_fp8_long.log" 2>&1
RC_LONG=$?
SIZES=(--batches 1,16,64 --contexts 2048,20480 --prefill 8192 --model-batches 16)
for dt in bf16 fp8_e4m3; do
  timeout 150 "$P/bin/mxserve" bench-model --config "$AIR" --synthetic-weights --num-layers 2 --quantization mxfp4 \
    --backend cuda --kv-cache-dtype "$dt" "${SIZES[@]}" --md "$OUT/bench_model_kv_$dt.md" > "$OUT/bench_model_kv_$dt.log" 2>&1
done
{
  echo "==== summary ===="
  echo "test_cuda_kv_fp8 rc=$RC_OPS   test_cuda_ops rc=$RC_CUDA_OPS   eval compare (20k window) rc=$RC_LONG"
  grep -E "^\[  (     OK|FAILED |SKIPPED) \]|Failure|err  |differ" "$OUT/kv_fp8_ops.log" | head -80
  grep -E "FAILED|PASSED" "$OUT/cuda_ops.log" | head -10
  grep -E "error|KL|top-1|relative|perplexity|tokens" "$OUT/kv_fp8_long.log" | head -10
  for dt in bf16 fp8_e4m3; do echo "---- bench-model kv $dt"; cat "$OUT/bench_model_kv_$dt.md" 2>/dev/null; grep -E "error|KV cache" "$OUT/bench_model_kv_$dt.log" | head -4; done
} | tee "$OUT/summary.txt"
