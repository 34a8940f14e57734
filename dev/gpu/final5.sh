#!/bin/bash
# Session 5's closing device call (~7 minutes), from a payload (dev/make_gpu_payload.sh):
# phase 1 (side by side): the GPU tests of the prefill kernels (wgmma / wgmma_ws attention, W4A16 and W4A8 MoE,
#   the op suite with RoPE) and the model-level ones (fixtures, CUDA graphs), plus memcheck of the attention test;
# phase 2 (quiet GPU): prefill_limits.sh without ncu -- whole GLM-4.5-Air TTFT (lone 10k, 20k with 12k cached,
#   cold 20k) at 2048 / 8192 / 16384-token prefill chunks, and W4A8 at 16384 with its start-up gate line;
# phase 3: profile_prefill.sh (Nsight Compute time per kernel of an 8k prefill, 8 layers).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
t "phase 1: tests"
# The W4A8 oracle's host reference dominates: its GLM-5.2 cases run in a second process beside the rest.
( timeout 280 "$B/test_cuda_moe_mxfp4_wg8" --gtest_filter='CudaMoeMxfp4Wg8.Glm52' > "$OUT/t_wg8_glm52.log" 2>&1
  echo "test_cuda_moe_mxfp4_wg8 (Glm52) rc=$?" >> "$OUT/tests_rc.txt" ) &
( timeout 280 "$B/test_cuda_moe_mxfp4_wg8" --gtest_filter='-CudaMoeMxfp4Wg8.Glm52' > "$OUT/t_wg8_rest.log" 2>&1
  echo "test_cuda_moe_mxfp4_wg8 (all but Glm52) rc=$?" >> "$OUT/tests_rc.txt" ) &
for tst in test_cuda_attention_wgmma test_cuda_moe_mxfp4_wg test_cuda_moe_mxfp4 test_cuda_ops \
           test_cuda_fixture test_cuda_graphs; do
  ( [ -x "$B/$tst" ] || { echo "$tst: not in payload" >> "$OUT/tests_rc.txt"; exit 0; }
    timeout 280 "$B/$tst" > "$OUT/t_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/tests_rc.txt" ) &
done
( SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  timeout 280 "$SAN" --tool memcheck "$B/test_cuda_attention_wgmma" --gtest_filter='*MatchesCpuReference' \
    > "$OUT/memcheck_attn.log" 2>&1; echo "memcheck attention rc=$?" >> "$OUT/tests_rc.txt" ) &
wait
t "phase 1 done"; cat "$OUT/tests_rc.txt"
for f in "$OUT"/t_*.log; do echo "== $(basename $f)"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$f" | head -6; done
grep -E "ERROR SUMMARY" "$OUT/memcheck_attn.log"
cat "$OUT"/t_wg8_*.log > "$OUT/t_test_cuda_moe_mxfp4_wg8.log"
for f in t_wg8_rest t_wg8_glm52; do echo "== $f"; grep -E "^\[  (PASSED|FAILED) " "$OUT/$f.log"; done
grep -E "^CASE|^FAIL" "$OUT/t_test_cuda_moe_mxfp4_wg8.log" | cut -c1-200 | head -24
grep -E "PASS|FAIL" "$OUT/t_test_cuda_attention_wgmma.log" | grep -E "wgmma_ws|plan" | cut -c1-160 | head -12
t "phase 2: whole-model TTFT"
SKIP_NCU=1 MX_W4A8=1 CHUNKS="${FINAL_CHUNKS:-2048 16384}" TTFT_REPEATS=${TTFT_REPEATS:-2} OUT=$OUT/ttft bash "$P/gpu/prefill_limits.sh" 2>&1 | grep -vE "^(lone|20k)" 
t "phase 3: ncu per-kernel time of an 8k prefill"
OUT=$OUT/profile timeout 120 bash "$P/gpu/profile_prefill.sh" 2>&1 | head -24
t done
