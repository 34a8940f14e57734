#!/bin/bash
# Mixed-step attention and the decode split tuner on the GPU (issue 17 item 5; docs/perf/decode-path.md), from a
# payload folder made by dev/make_gpu_payload.sh. Writes to $OUT (or /tmp/mxserve_gpu):
#   attn_mixed.log   test_cuda_attention_mixed: decode rows + a prefill chunk, split / shared / warp paths vs the
#                    CPU reference, bf16 and FP8 caches; the planner's split
#   attn_ops.log     test_cuda_ops + test_cuda_kv_fp8 attention cases (every path the change touched)
#   bench_mixed.md   bench_cuda_kernels --mixed-only: 30 decode rows at 20k + a 2048-token chunk, [split] vs
#                    [shared] (the old path), and the decode rows / the chunk alone
#   tune_*.log/json  mxserve tune-attention for GLM-4.x heads (96 / 8 / 128), bf16 and FP8 caches
#                    (TUNE_ARGS, default the full grid: rows 1..256 x contexts 1k..128k)
# Budget: ~2 min for the tests and the bench, ~2-4 min per tuner run (full grid).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}
mkdir -p "$OUT" "$P/lib"
[ -f "$P/libs.tar.xz" ] && [ ! -f "$P/lib/.unpacked" ] && tar -xJf "$P/libs.tar.xz" -C "$P/lib" && touch "$P/lib/.unpacked"
[ -f "$P/bin.tar.xz" ] && [ ! -x "$P/bin/mxserve" ] && tar -xJf "$P/bin.tar.xz" -C "$P"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"

timeout 240 "$P/bin/test_cuda_attention_mixed" --gtest_color=no > "$OUT/attn_mixed.log" 2>&1
RC_MIXED=$?
{ timeout 180 "$P/bin/test_cuda_ops" --gtest_color=no --gtest_filter='*Attention*'
  timeout 180 "$P/bin/test_cuda_kv_fp8" --gtest_color=no --gtest_filter='*Attention*'; } > "$OUT/attn_ops.log" 2>&1
RC_OPS=$?
timeout 240 "$P/bin/bench_cuda_kernels" --mixed-only --md "$OUT/bench_mixed.md" > "$OUT/bench_mixed.log" 2>&1
RC_BENCH=$?
RC_TUNE=""
for dt in bf16 fp8_e4m3; do
  timeout 420 "$P/bin/mxserve" tune-attention --heads 96 --kv-heads 8 --head-dim 128 --kv-cache-dtype "$dt" \
    ${TUNE_ARGS:-} --out "$OUT/nvidia_h200_Q96_KV8_D128_$dt.json" > "$OUT/tune_$dt.log" 2>&1
  RC_TUNE="$RC_TUNE $dt=$?"
done
{
  echo "==== summary ===="
  echo "test_cuda_attention_mixed rc=$RC_MIXED   attention ops rc=$RC_OPS   bench rc=$RC_BENCH   tune-attention rc:$RC_TUNE"
  grep -E "^\[ (PASS|FAIL|plan) |^\[  (     OK|FAILED |SKIPPED) \]|Failure" "$OUT/attn_mixed.log" | head -60
  grep -E "^\[  (FAILED|PASSED) " "$OUT/attn_ops.log" | head -10
  cat "$OUT/bench_mixed.md" 2>/dev/null; grep -E "error" "$OUT/bench_mixed.log" | head -4
  for dt in bf16 fp8_e4m3; do echo "---- tune-attention $dt"; cat "$OUT/tune_$dt.log"; done
} | tee "$OUT/summary.txt"
