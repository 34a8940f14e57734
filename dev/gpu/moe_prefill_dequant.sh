#!/bin/bash
# The MXFP4 MoE prefill dequant path (issue 33 item 2 prototype: dequantize the step's active experts to bf16,
# then a bf16 wgmma grouped GEMM; kernels/cuda/moe_mxfp4/moe_prefill_dequant.h) on the GPU machine, from a payload
# folder made by dev/make_gpu_payload.sh. Default: its oracle test (PASS/FAIL per case and tile: vs the host
# reference, vs the W4A16 wg_n128_s3 path, the small shape vs the CPU backend) then the benchmark against the
# current W4A16 path in the same run (us, TFLOP/s, dequant GB/s, GEMM us, fraction of the cuBLASLt ceiling)
# -> $OUT/moe_prefill_dequant_test.log, $OUT/moe_prefill_dequant_bench.log.
# MOE_PREFILL_DEQUANT_E2E=1 instead (its own device call): 8 layers of GLM-4.5-Air, prefill 8192, without and with
# the path (MXSERVE_MOE_PREFILL_DEQUANT=0 / 1), same card, same binary -> $OUT/moe_prefill_dequant_e2e_{off,on}.md.
#   usage: moe_prefill_dequant.sh [M ...]      (OUT defaults to /tmp/mxserve_gpu; M defaults to 2048 8192)
set -u
. "$(dirname "$0")/payload_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/moe_prefill_dequant_gpu.txt"
if [ "${MOE_PREFILL_DEQUANT_E2E:-0}" = 1 ]; then
  for mode in off on; do
    flag=0; [ "$mode" = on ] && flag=1
    MXSERVE_MOE_PREFILL_DEQUANT=$flag timeout 280 "$P/bin/mxserve" bench-model --config "$P/configs/air.json" \
      --synthetic-weights --num-layers 8 --quantization mxfp4 --backend cuda --batches 1 --contexts 8192 \
      --prefill 8192 --md "$OUT/moe_prefill_dequant_e2e_$mode.md" > "$OUT/moe_prefill_dequant_e2e_$mode.log" 2>&1
    echo "bench-model ($mode) rc=$? (124 = timeout)"
    grep -iE "prefill|MXSERVE_MOE_PREFILL_DEQUANT|dequant path|warn|error" "$OUT/moe_prefill_dequant_e2e_$mode.log" | head -20
  done
  exit 0
fi
timeout 420 "$P/bin/test_cuda_moe_prefill_dequant" --gtest_color=no > "$OUT/moe_prefill_dequant_test.log" 2>&1
echo "test rc=$? (124 = timeout)"
grep -E "^(PASS|FAIL|CASE) |seed|^\[  (PASSED|FAILED|SKIPPED) |warn|rror" "$OUT/moe_prefill_dequant_test.log"
timeout 150 "$P/bin/bench_moe_prefill_dequant" "$@" 2>&1 | tee "$OUT/moe_prefill_dequant_bench.log"
echo "bench rc=${PIPESTATUS[0]} (124 = timeout)"
