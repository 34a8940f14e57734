#!/bin/bash
# Issue 36 item 5 on the GPU machine (sm_90), from a payload folder made by dev/make_gpu_payload.sh: the sparse MLA
# prefill attend (MlaAttendKernel::kWgmmaPrefill, mla_sparse_prefill_wgmma.cu) against the CPU reference and the
# mma.sync op (test_cuda_mla_dsa MlaAttentionSparsePrefillKernel: one "[ err ]" line per case, all three schedules
# bitwise equal "[ exact ]"; must run, not skip, on an H100 / H200), the other MLA attention tests (nothing else
# changed), then bench_mla_sparse_prefill (8192 rows over 20480 keys, top-2048, 64 and 16 heads; overlapping and
# independent top-k sets) -> $OUT/mla_sp_test.log, $OUT/mla_sp_bench.log, $OUT/mla_sp_bench_random.log.
#   usage: mla_sparse_prefill.sh   (OUT /tmp/mxserve_gpu)
set -u
. "$(dirname "$0")/payload_env.sh"
timeout 300 "$P/bin/test_cuda_mla_dsa" --gtest_color=no --gtest_filter='CudaMlaDsa.MlaAttention*' \
  > "$OUT/mla_sp_test.log" 2>&1
echo "test rc=$? (124 = timeout)"
grep -E "^\[ (err|exact) +\] MlaAttentionSparsePrefill|^\[  (     OK|FAILED|  PASSED|  SKIPPED) \]|Failure" \
  "$OUT/mla_sp_test.log" | head -60
timeout 240 "$P/bin/bench_mla_sparse_prefill" > "$OUT/mla_sp_bench.log" 2>&1
echo "bench rc=$?"; cat "$OUT/mla_sp_bench.log"
timeout 200 "$P/bin/bench_mla_sparse_prefill" --heads 64 --random-topk --no-mma > "$OUT/mla_sp_bench_random.log" 2>&1
echo "bench --random-topk rc=$?"; cat "$OUT/mla_sp_bench_random.log"
