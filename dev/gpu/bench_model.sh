#!/bin/bash
# Synthetic weights on the GPU + `mxserve bench-model` on GLM-4.5-Air, run on the GPU machine from a
# payload folder made by dev/make_gpu_payload.sh (it copies this script to the payload's top level).
# Writes to $OUT (or /tmp/mxserve_gpu): gpu.txt (machine), synthetic_tests.log (test_cuda_synthetic),
# load_full_air.log (full 46-layer Air load, mxfp4 plan), bench_model_bf16.{log,md,json},
# bench_model_mxfp4.{log,md,json}, bench_model.md / bench_model.json (the bf16 run, plus the mxfp4 run's
# markdown appended), summary.txt. Budget: ~4 minutes on an H200.
#   usage: bash bench_model.sh [--quick]     (--quick: decode batch 1,8, contexts 2048, prefill 1024)
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}  # the payload folder (this script sits in its gpu/)
OUT=${OUT:-/tmp/mxserve_gpu}
mkdir -p "$OUT" "$P/lib"
QUICK=0
for a in "$@"; do case $a in --quick) QUICK=1 ;; esac; done
tar -xJf "$P/libs.tar.xz" -C "$P/lib"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"
AIR="$P/configs/air.json"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv;
  ldd "$P/bin/mxserve" | grep -E "not found|cublas|cudart"; cat "$P/commit.txt"; } 2>&1 | tee "$OUT/gpu.txt"

# 1. CUDA-generated synthetic weights == CPU-generated (bitwise), truncated model logits CUDA vs CPU.
timeout 120 "$P/bin/test_cuda_synthetic" --gtest_color=no > "$OUT/synthetic_tests.log" 2>&1
RC_TEST=$?

SIZES=(--batches 1,8,32,64 --contexts 2048,8192 --prefill 1024,8192,20480)
[ $QUICK = 1 ] && SIZES=(--batches 1,8 --contexts 2048 --prefill 1024)
# 2. bench-model, bf16, Air truncated to 2 layers (layer 0 dense, layer 1 MoE).
timeout 150 "$P/bin/mxserve" bench-model --config "$AIR" --synthetic-weights --num-layers 2 --backend cuda \
  "${SIZES[@]}" --md "$OUT/bench_model_bf16.md" --json "$OUT/bench_model_bf16.json" > "$OUT/bench_model_bf16.log" 2>&1
RC_BF16=$?
# 3. The same with MXFP4 experts (packed on the device when the CUDA backend supports kMxfp4, else
#    dequantized to bf16 on load: the log says which).
timeout 120 "$P/bin/mxserve" bench-model --config "$AIR" --synthetic-weights --num-layers 2 --backend cuda \
  --quantization mxfp4 "${SIZES[@]}" --md "$OUT/bench_model_mxfp4.md" --json "$OUT/bench_model_mxfp4.json" \
  > "$OUT/bench_model_mxfp4.log" 2>&1
RC_MX=$?
# 4. Full GLM-4.5-Air (46 layers) with MXFP4 experts: load time and memory (4 decode tokens). Without
#    packed MXFP4 support in the CUDA backend the experts dequantize to bf16 (~200 GB): expect an
#    out-of-memory error then, which the log shows.
TIMEV=(); [ -x /usr/bin/time ] && TIMEV=(/usr/bin/time -v)   # peak host memory when available
"${TIMEV[@]}" timeout 90 "$P/bin/mxserve" generate --config "$AIR" --synthetic-weights --backend cuda \
  --quantization mxfp4 --ids 9707,11,1879 --max-tokens 4 --ignore-eos > "$OUT/load_full_air.log" 2>&1
RC_FULL=$?
nvidia-smi --query-gpu=memory.used --format=csv >> "$OUT/load_full_air.log" 2>&1

cp "$OUT/bench_model_bf16.json" "$OUT/bench_model.json" 2>/dev/null
{ [ -f "$OUT/bench_model_bf16.md" ] && { echo "## bf16"; echo; cat "$OUT/bench_model_bf16.md"; }
  [ -f "$OUT/bench_model_mxfp4.md" ] && { echo; echo "## --quantization mxfp4"; echo; cat "$OUT/bench_model_mxfp4.md"; }
} > "$OUT/bench_model.md"
{
  echo "==== summary ===="
  echo "synthetic tests rc=$RC_TEST   bench-model bf16 rc=$RC_BF16   bench-model mxfp4 rc=$RC_MX   full Air load rc=$RC_FULL"
  grep -E "^\[  (     OK|FAILED |SKIPPED) \]|Failure|rel_l2|mismatch|Expected|Which is" "$OUT/synthetic_tests.log" | head -30
  for f in bench_model_bf16 bench_model_mxfp4; do
    echo "---- $f"; grep -E "error|synthetic|ceilings|loaded in|CHECK|what" "$OUT/$f.log" | head -12
  done
  echo "---- full Air"; grep -E "error|synthetic|generated|Maximum resident|Elapsed|MiB|CHECK" "$OUT/load_full_air.log" | head -12
  cat "$OUT/bench_model.md"
} 2>&1 | tee "$OUT/summary.txt"
