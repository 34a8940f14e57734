#!/bin/bash
# Session 8, first kernel call: the FP8 latent rows in the wgmma MLA attend (test_cuda_mla_fp8, the quality bound on
# the GLM-5 attend shape, bench_mla_fp8 wgmma FP8 vs bf16) and the sparse MLA prefill attend (mla_sparse_prefill.sh),
# plus the bf16 wgmma attend unchanged (test_cuda_mla_dsa, bench_mla_decode).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd) MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for tst in test_cuda_mla_fp8 test_cuda_mla_fp8_quality; do
  timeout 150 "$B/$tst" --gtest_color=no > "$OUT/t_$tst.log" 2>&1; echo "$tst rc=$?"
  grep -E "^\[  FAILED|^\[  PASSED|Failure|attend step runs" "$OUT/t_$tst.log" | head -8
  grep -E "\[ err|bytes differ|bound" "$OUT/t_$tst.log" | grep -v PASS | head -8
done
t "fp8 bench"
timeout 150 "$B/bench_mla_fp8" --heads 64 --wgmma-only > "$OUT/fp8_64.log" 2>&1; echo "bench_mla_fp8 64 rc=$?"; cat "$OUT/fp8_64.log" | tail -30
timeout 100 "$B/bench_mla_fp8" --heads 16 --wgmma-only > "$OUT/fp8_16.log" 2>&1; echo "bench_mla_fp8 16 rc=$?"; cat "$OUT/fp8_16.log" | tail -16
t "sparse prefill"
OUT=$OUT/sp bash "$P/gpu/mla_sparse_prefill.sh"
t "bf16 decode bench"
timeout 150 "$B/bench_mla_decode" --heads 64 --no-simple > "$OUT/mla_decode.log" 2>&1; echo "bench_mla_decode rc=$?"; tail -25 "$OUT/mla_decode.log"
t done
