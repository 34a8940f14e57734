#!/bin/bash
# The whole GLM-4.5-Air config (46 layers + MTP, synthetic weights generated on the GPU) with MXFP4 routed
# experts on one H200, end to end (issue 9): the MXFP4 integration test, then `mxserve generate` whose log
# must show the tuned tables selected for E128_H4096_I1408_K8 and no fallback warning. Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
echo "== test_cuda_mxfp4_moe"
timeout 120 "$P/bin/test_cuda_mxfp4_moe" --gtest_color=no > "$OUT/mxfp4_moe_test.log" 2>&1; echo "rc=$?"
grep -E "^\[  (     OK|FAILED ) \]|rel_l2|Failure" "$OUT/mxfp4_moe_test.log" | head -20
echo "== generate, GLM-4.5-Air 46 layers, --quantization mxfp4"
/usr/bin/time -v timeout 200 "$P/bin/mxserve" generate --config "$P/configs/air.json" --synthetic-weights \
  --quantization mxfp4 --backend cuda --prompt-len 1000 --max-tokens 128 --ignore-eos > "$OUT/e2e_generate.log" 2>&1
echo "rc=$?"
nvidia-smi --query-gpu=memory.used --format=csv >> "$OUT/e2e_generate.log" 2>&1
grep -vE "^\s+(Average|Major|Minor|Voluntary|Involuntary|Swaps|File|Socket|Signals|Page|Percent|System|User|Exit)" \
  "$OUT/e2e_generate.log" | grep -iE "moe|warn|error|tok/s|synthetic|ready|Maximum resident|Elapsed" | cut -c1-400 | head -40
echo "== fallback warnings (expect none):"
# NOTE: the stage's exit status is this check's (grep -c alone exits 1 when it finds none).
n=$(grep -ciE "no tuned|heuristic|fallback|tune-moe" "$OUT/e2e_generate.log")
echo "$n"
[ "$n" = 0 ]
