#!/bin/bash
# Session 18: the block scan shared by the DSA top-k select and the FP8 dequantize-once index kernel
# (kernels/cuda/common/block_scan.cuh, commit f6579b8, reverted by 085accd until a GPU has run it) checked on a GPU:
# the oracle tests of both users. Here: `git cherry-pick f6579b8`, build the three tests, then a payload made with
# MXSERVE_PAYLOAD_ONLY="test_cuda_attention_wgmma test_cuda_kv_fp8 test_cuda_mla_dsa" (dev/make_gpu_payload.sh);
# there: `bash PAYLOAD/gpu/s18_blockscan.sh`. All three must pass before the move lands again.
set -u
. "$(dirname "$0")/payload_env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for t_ in test_cuda_attention_wgmma test_cuda_kv_fp8 test_cuda_mla_dsa; do
  t "$t_"
  timeout 150 "$B/$t_" > "$OUT/$t_.log" 2>&1; echo "$t_ rc=$?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" "$OUT/$t_.log" | cut -c1-220
done
t done
