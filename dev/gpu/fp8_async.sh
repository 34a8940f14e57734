#!/bin/bash
# The FP8 KV cache's cp.async tile loader (kv_fp8_tile.cuh; issue 33's FP8 decode attention) on the GPU, from a payload
# folder made by dev/make_gpu_payload.sh. Writes to $OUT (or /tmp/mxserve_gpu):
#   fp8_ops.log      test_cuda_kv_fp8 attention (every kernel on the FP8 cache vs the CPU, and the cp.async loader
#                    == the plain loads byte for byte) + test_cuda_cascade_attention (bf16 / FP8 cascade vs the
#                    per-sequence kernel and the CPU; Fp8CpAsyncLoaderBitIdenticalToPlainLoads)
#   fp8_bench.log    bench_cascade_attention --sweep --fp8-loads both: per-sequence (the per-warp decode kernel) and
#                    cascade us for bf16, fp8-plain (before) and fp8 (after) at batch 16, 20k context
#   fp8_kernels.log  bench_cuda_kernels --mixed-only with MXSERVE_FP8_KV_PLAIN_LOADS=1 (before) and without (after)
#   summary.txt
# Budget: ~4 minutes on an H100 / H200.
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_FIXTURE_ROOT="$P/fixtures"

{ timeout 180 "$P/bin/test_cuda_kv_fp8" --gtest_color=no --gtest_filter='*Attention*'
  echo "test_cuda_kv_fp8 rc=$?"
  timeout 240 "$P/bin/test_cuda_cascade_attention" --gtest_color=no
  echo "test_cuda_cascade_attention rc=$?"; } > "$OUT/fp8_ops.log" 2>&1
timeout 200 "$P/bin/bench_cascade_attention" --sweep --fp8-loads both > "$OUT/fp8_bench.log" 2>&1
echo "bench_cascade_attention rc=$?" >> "$OUT/fp8_bench.log"
{ echo "== before: MXSERVE_FP8_KV_PLAIN_LOADS=1"
  MXSERVE_FP8_KV_PLAIN_LOADS=1 timeout 120 "$P/bin/bench_cuda_kernels" --mixed-only
  echo "== after: the cp.async loader"
  timeout 120 "$P/bin/bench_cuda_kernels" --mixed-only; } > "$OUT/fp8_kernels.log" 2>&1
{
  echo "==== summary ===="
  grep -E "rc=|^\[  (     OK|FAILED |SKIPPED) \]|Failure|differ" "$OUT/fp8_ops.log" | head -60
  cut -c1-230 "$OUT/fp8_bench.log"
  grep -E "^==|fp8|rc=" "$OUT/fp8_kernels.log" | head -40
} | tee "$OUT/summary.txt"
