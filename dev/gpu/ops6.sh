#!/bin/bash
# Session 6: every GPU op test after the kernel retirements and the one-harness refactor (issue 31 item 7), side by
# side (the W4A8 oracle's GLM-5.2 cases in their own process, as final5.sh), each its PASS/FAIL lines.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
: > "$OUT/tests_rc.txt"
( timeout 270 "$B/test_cuda_moe_mxfp4_wg8" --gtest_filter='CudaMoeMxfp4Wg8.Glm52' > "$OUT/t_wg8_glm52.log" 2>&1
  echo "test_cuda_moe_mxfp4_wg8 (Glm52) rc=$?" >> "$OUT/tests_rc.txt" ) &
( timeout 270 "$B/test_cuda_moe_mxfp4_wg8" --gtest_filter='-CudaMoeMxfp4Wg8.Glm52' > "$OUT/t_wg8_rest.log" 2>&1
  echo "test_cuda_moe_mxfp4_wg8 (rest) rc=$?" >> "$OUT/tests_rc.txt" ) &
for tst in test_cuda_moe_mxfp4 test_cuda_moe_mxfp4_wg test_cuda_attention_wgmma test_cuda_attention_mixed \
           test_cuda_kv_fp8 test_cuda_ops test_cuda_mla_dsa test_cuda_sampling test_cuda_skinny_gemm \
           test_cuda_peer_allreduce test_cuda_nccl test_cuda_mxfp4_moe test_cuda_synthetic; do
  ( [ -x "$B/$tst" ] || { echo "$tst: not in payload" >> "$OUT/tests_rc.txt"; exit 0; }
    timeout 270 "$B/$tst" --gtest_color=no > "$OUT/t_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/tests_rc.txt" ) &
done
wait
sort "$OUT/tests_rc.txt"
for f in "$OUT"/t_*.log; do
  n_ok=$(grep -c "^\[       OK \]" "$f"); n_fail=$(grep -c "^\[  FAILED  \]" "$f")
  echo "$(basename $f .log): ${n_ok} ok, ${n_fail} failed lines"; grep "^\[  FAILED  \]" "$f" | head -5
done
