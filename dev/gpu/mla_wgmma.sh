#!/bin/bash
# Issue 36 item 2 on the GPU machine (sm_90), from a payload folder made by dev/make_gpu_payload.sh: the Hopper
# absorbed-MLA path (MlaAttendKernel::kWgmma: mla_decode_wgmma.cu + mla_absorb_mma.cu) against the CPU reference and
# the mma.sync kernel (test_cuda_mla_dsa MlaAttention*: one "[ err ]" line per case and split count, PASS/FAIL; the
# wgmma test must run, not skip, on an H100 / H200), then bench_mla_decode per heads count (a "<case> wgmma" row per
# case: attend alone, whole op, fraction of copy bandwidth, op / attend; MET / MISSED for >= 70% at batch 16 / 64,
# dense 20k) -> $OUT/mla_wgmma_test.log, $OUT/mla_wgmma_bench_h<H>.log.
#   usage: mla_wgmma.sh [bench flags, e.g. --quick or --wgmma-sweep]   (HEADS="64 8" by default; OUT /tmp/mxserve_gpu)
set -u
. "$(dirname "$0")/payload_env.sh"
timeout 300 "$P/bin/test_cuda_mla_dsa" --gtest_color=no --gtest_filter='CudaMlaDsa.MlaAttention*' \
  > "$OUT/mla_wgmma_test.log" 2>&1
echo "test rc=$? (124 = timeout)"
grep -E "^\[ err +\] MlaAttentionWgmma|^\[  (     OK|FAILED|  PASSED|  SKIPPED) \]|Failure" "$OUT/mla_wgmma_test.log" \
  | grep -E "FAIL|OK|PASSED|SKIPPED|Failure|wgmma 64 heads, decode" | head -60
for h in ${HEADS:-64 8}; do
  timeout 240 "$P/bin/bench_mla_decode" --heads "$h" --no-simple "$@" > "$OUT/mla_wgmma_bench_h$h.log" 2>&1
  echo "bench --heads $h rc=$?"
  grep -E "^case|wgmma|MET|MISSED|^PASS|^FAIL" "$OUT/mla_wgmma_bench_h$h.log" | grep -v "indexer"
done
