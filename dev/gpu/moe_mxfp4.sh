#!/bin/bash
# MXFP4 MoE kernels on the GPU machine (issue 9), run from a payload folder made by dev/make_gpu_payload.sh:
#   1. test_cuda_moe_mxfp4 (every variant vs the CPU reference)          -> $OUT/moe_mxfp4_test.log
#   2. tune-moe for GLM-5.2, GLM-4.5-Air, GLM-4.5 (per-variant timings in the logs, and the heuristic's
#      time per bucket)                                                     -> $OUT/moe_tables/*.json, $OUT/moe_tune_E*.log
#   3. bench-kernels moe, GLM-4.5-Air and GLM-5.2, on the tuned tables      -> $OUT/moe_bench_{air,glm52}.{log,md}
#   4. SASS instruction counts per MXFP4 kernel (cuobjdump)                -> $OUT/moe_sass.txt
# and prints a summary ($OUT/moe_summary.txt). Budgeted to finish within 6 minutes on an H200: every step
# has a timeout (60 + 3 x 55 + 2 x 45 s = 315 s, inside run_all's moe:330); the tuner rewrites its table
# after every M bucket, so a timeout still leaves a valid (partial) table. Per-variant times of the deciding
# buckets: $OUT/moe_tune_variants.txt.
#   usage: moe_mxfp4.sh        (OUT defaults to /tmp/mxserve_gpu)
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}  # the payload folder (this script sits in its gpu/)
OUT=${OUT:-/tmp/mxserve_gpu}
mkdir -p "$OUT/moe_tables" "$P/lib"
START=$(date +%s)
[ -f "$P/libs.tar.xz" ] && tar -xJf "$P/libs.tar.xz" -C "$P/lib"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
BIN="$P/bin"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv;
  cat "$P/commit.txt" 2>/dev/null; } 2>&1 | tee "$OUT/moe_gpu.txt"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | sed 's/^ *//; s/ *$//; s/ /_/g' | tr 'A-Z' 'a-z')
[ -n "$GPU" ] || GPU=unknown_gpu

# SASS facts per MXFP4 kernel: tensor-core ops (HMMA), byte permutes (PRMT, the dequant), bf16 multiplies
# (HMUL2), global loads, total instructions.
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
if [ -x "$CUOBJDUMP" ]; then
  "$CUOBJDUMP" -sass "$BIN/test_cuda_moe_mxfp4" 2>/dev/null | awk '
    /Function :/ {f=$3}
    f ~ /mxfp4/ && /\/\*[0-9a-f]+\*\// {n[f]++; if (/HMMA/) h[f]++; if (/PRMT/) p[f]++; if (/HMUL2|HFMA2/) m[f]++;
                                        if (/LDG/) g[f]++; if (/LDS/) s[f]++; if (/FFMA/) ff[f]++}
    END {for (k in n) printf "sass %-6d instr  HMMA %-4d PRMT %-4d HMUL2 %-4d FFMA %-4d LDG %-3d LDS %-3d %s\n",
                              n[k], h[k], p[k], m[k], ff[k], g[k], s[k], k}' |
    sed 's/_ZN7mxserve7kernels4cuda[0-9]*_GLOBAL__N__[0-9a-f_]*cu_[0-9a-f_]*//' | cut -c1-200 > "$OUT/moe_sass.txt"
fi

timeout 60 "$BIN/test_cuda_moe_mxfp4" --gtest_color=no > "$OUT/moe_mxfp4_test.log" 2>&1
RC_TEST=$?

RC_TUNE=""
# MOE_TUNE_SHAPES / MOE_BENCH_SHAPES ("E,H,I,K;..." and "label,E,H,I,K;...", or "none") narrow the run when
# device time is short.
IFS=';' read -r -a TUNE_SHAPES <<< "${MOE_TUNE_SHAPES:-256,6144,2048,8;128,4096,1408,8;160,5120,1536,8}"
IFS=';' read -r -a BENCH_SHAPES <<< "${MOE_BENCH_SHAPES:-air,128,4096,1408,8;glm52,256,6144,2048,8}"
[ "${MOE_BENCH_SHAPES:-}" = none ] && BENCH_SHAPES=()  # "none": tune only
for shape in "${TUNE_SHAPES[@]}"; do
  set -- ${shape//,/ }
  F="$OUT/moe_tables/${GPU}_E$1_H$2_I$3_K$4_mxfp4.json"
  timeout 55 "$BIN/mxserve" tune-moe --experts $1 --hidden $2 --inter $3 --top-k $4 --dtype mxfp4 --out "$F" \
    > "$OUT/moe_tune_E$1.log" 2>&1
  RC_TUNE="$RC_TUNE E$1=$?"
done

RC_BENCH=""
for shape in "${BENCH_SHAPES[@]}"; do
  set -- ${shape//,/ }
  T="$OUT/moe_tables/${GPU}_E$2_H$3_I$4_K$5_mxfp4.json"
  TABLE=""; [ -s "$T" ] && TABLE="--table $T"
  timeout 45 "$BIN/mxserve" bench-kernels moe --experts $2 --hidden $3 --inter $4 --top-k $5 $TABLE \
    --md "$OUT/moe_bench_$1.md" > "$OUT/moe_bench_$1.log" 2>&1
  RC_BENCH="$RC_BENCH $1=$?"
done

# Per-variant times of the buckets that decide the heuristic (gv_* / pf_* / wg_* vs tc_*), fastest first.
for f in "$OUT"/moe_tune_E*.log; do
  echo "-- $(basename "$f") per variant, m in 1 8 64 1024 8192"
  for m in 1 8 64 1024 8192; do grep -E "^  m=$m " "$f" | sort -k2,2 -k4,4g; done
done > "$OUT/moe_tune_variants.txt" 2>&1

# NOTE: run_all.sh keeps the last 40 lines of this output: the bench tables come last.
{
  echo "==== moe_mxfp4 summary ($(( $(date +%s) - START )) s) ===="
  cat "$OUT/moe_sass.txt" 2>/dev/null
  ls -la "$OUT/moe_tables"
  for f in "$OUT"/moe_tune_E*.log; do echo "-- $(basename $f)"; grep -E "^m=|wrote|REJECTED|error" "$f" | head -20; done
  echo "test rc=$RC_TEST   bench rc:$RC_BENCH   tune rc:$RC_TUNE   (124 = timeout)"
  grep -E "^\[  (     OK|FAILED |SKIPPED) \]|Failure|Expected|Which is|seed" "$OUT/moe_mxfp4_test.log" | head -40
  echo "-- the 5 largest errors (rel_l2 first):"
  grep rel_l2 "$OUT/moe_mxfp4_test.log" | awk '{for (i = 1; i < NF; i++) if ($i == "rel_l2") print $(i + 1), $0}' | sort -g | tail -5
  for b in air glm52; do
    echo "-- bench $b"
    if [ -s "$OUT/moe_bench_$b.md" ]; then grep -E "^\| |ceilings" "$OUT/moe_bench_$b.md"
    else grep -E "^\| [0-9]|error" "$OUT/moe_bench_$b.log" | head -20; fi
  done
} 2>&1 | tee "$OUT/moe_summary.txt"
