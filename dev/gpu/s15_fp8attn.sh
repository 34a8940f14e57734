#!/bin/bash
# Session 15, issue 33: the wgmma prefill attention over an FP8 E4M3 KV cache (its producer warpgroup dequantizes).
# (1) the oracle tests: test_cuda_attention_wgmma (bf16 cases, the planner, and Fp8CacheMatchesSharedKernel: wgmma_ws
# vs the mma.sync shared kernel on the same codes) and test_cuda_kv_fp8 (every kernel, wgmma_ws included, vs the CPU
# on the same FP8 bytes); (2) compute-sanitizer memcheck on the small FP8 cases; (3) bench_prefill_attention --fp8:
# shared / wgmma_ws over bf16 and FP8 caches at GLM-4.5-Air prefill shapes, timed in one run. Run by run_all.sh.
# FP8ATTN_QUICK=1: no memcheck, the benchmark's first three shapes only (a call that has a knee run after it).
set -u
. "$(dirname "$0")/payload_env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t "(1) oracle tests"
timeout 150 "$B/test_cuda_attention_wgmma" > "$OUT/wgmma.log" 2>&1; echo "test_cuda_attention_wgmma rc=$?"
grep -E "^\[ (PASS|FAIL) \]|^\[  (PASSED|FAILED) |FAILED|tests ran" "$OUT/wgmma.log" | cut -c1-260
timeout 90 "$B/test_cuda_kv_fp8" > "$OUT/kv_fp8.log" 2>&1; echo "test_cuda_kv_fp8 rc=$?"
grep -E "wgmma_ws|FAILED|PASSED|tests ran|prefill attention" "$OUT/kv_fp8.log" | cut -c1-200
t "(2) compute-sanitizer memcheck, small FP8 cases"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "${FP8ATTN_QUICK:-0}" = 1 ]; then echo "skipped (FP8ATTN_QUICK=1)"
elif [ -x "$CS" ]; then
  timeout 120 "$CS" --tool memcheck --print-limit 5 "$B/test_cuda_kv_fp8" --gtest_filter='*PagedAttentionReadsFp8Directly*' \
    > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head -5
else echo "compute-sanitizer not found"; fi
t "(3) bench_prefill_attention --fp8"
Q=(); [ "${FP8ATTN_QUICK:-0}" = 1 ] && Q=(--quick)
timeout 120 "$B/bench_prefill_attention" --fp8 "${Q[@]}" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
grep -E "GPU:|BENCH|PLAN" "$OUT/bench.log" | cut -c1-220
t done
