#!/bin/bash
# Design 9, the persistent MXFP4 MoE decode path (issue 33 item 3), on the GPU machine, from a payload folder made
# by dev/make_gpu_payload.sh. Default: its oracle test (one PASS/FAIL line per case: vs the host reference, vs the
# existing path, bitwise repeats across grids and CUDA-graph replays, other instances, +=) and the benchmark against
# the existing decode path (us, MB, GB/s, fraction of copy bandwidth) -> $OUT/moe_pd_test.log, $OUT/moe_pd_bench.log.
# MOE_PD_E2E=1 instead (its own device call): the 8-layer GLM-5.2 decode step (issue 36's batch-1 target) without
# and with design 9, same card, same binary (`bench-model`, MXSERVE_MOE_MXFP4_PD=0 / 1) -> $OUT/moe_pd_e2e_{old,pd}.md.
#   usage: moe_pd.sh [M ...]        (OUT defaults to /tmp/mxserve_gpu; M defaults to 1 8 16 64)
set -u
. "$(dirname "$0")/payload_env.sh"
if [ "${MOE_PD_E2E:-0}" = 1 ]; then
  for mode in old pd; do
    flag=0; [ "$mode" = pd ] && flag=1
    MXSERVE_MOE_MXFP4_PD=$flag timeout 280 "$P/bin/mxserve" bench-model --config "$P/configs/glm52.json" \
      --synthetic-weights --num-layers 8 --quantization mxfp4 --backend cuda --batches 1 --contexts 2048 \
      --prefill 2048 --model-batches 1,8 --md "$OUT/moe_pd_e2e_$mode.md" > "$OUT/moe_pd_e2e_$mode.log" 2>&1
    echo "bench-model ($mode) rc=$? (124 = timeout)"
    grep -iE "decode step|lm_head|MXSERVE_MOE_MXFP4_PD|warn" "$OUT/moe_pd_e2e_$mode.log" | head -20
  done
  exit 0
fi
timeout 330 "$P/bin/test_cuda_moe_mxfp4_pd" --gtest_color=no > "$OUT/moe_pd_test.log" 2>&1
echo "test rc=$? (124 = timeout)"
grep -E "^(PASS|FAIL) |seed|^\[  (PASSED|FAILED) |warn|rror" "$OUT/moe_pd_test.log"
timeout 240 "$P/bin/bench_moe_mxfp4_pd" "$@" 2>&1 | tee "$OUT/moe_pd_bench.log"
