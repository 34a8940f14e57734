#!/bin/bash
# The GPU suite, run on the GPU machine from a payload folder made by dev/make_gpu_payload.sh:
# CUDA op tests, GPU fixture tests, verify-fixture --backend cuda on every fixture, the kernel benchmark.
# Logs go to $OUT (the device tool's output folder) or /tmp/mxserve_gpu; a summary prints last.
#   usage: gpu_check.sh [--no-bench] [--sanitize]
set -u
P=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/mxserve_gpu}
mkdir -p "$OUT" "$P/lib"
BENCH=1; SANITIZE=0
for a in "$@"; do
  case $a in --no-bench) BENCH=0 ;; --sanitize) SANITIZE=1 ;; esac
done
tar -xJf "$P/libs.tar.xz" -C "$P/lib"
[ -d "$P/bin" ] || tar -xJf "$P/bin.tar.xz" -C "$P"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv;
  ldd "$P/bin/test_cuda_ops" | grep -E "not found|cublas|cudart|openblas"; cat "$P/commit.txt"; } 2>&1 | tee "$OUT/gpu.txt"

# Tensor-core instructions per kernel (HMMA = mma.sync / WMMA on Hopper's legacy path, HGMMA = wgmma).
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
[ -x "$CUOBJDUMP" ] && "$CUOBJDUMP" -sass "$P/bin/test_cuda_ops" 2>/dev/null |
  awk '/Function :/{f=$3} /HMMA|HGMMA/{c[f]++} END{for (k in c) print "sass mma count", c[k], k}' |
  sed 's/_ZN7mxserve7kernels4cuda[0-9]*_GLOBAL__N__[0-9a-f_]*cu_[0-9a-f]*//' | cut -c1-120 >> "$OUT/gpu.txt"

MXSERVE_CUDA_SYNC=1 timeout 150 "$P/bin/test_cuda_ops" --gtest_color=no > "$OUT/op_tests.log" 2>&1
RC_OPS=$?
timeout 100 "$P/bin/test_cuda_fixture" --gtest_color=no > "$OUT/fixture_tests.log" 2>&1
RC_FIX=$?
: > "$OUT/verify.log"
RC_VER=0
for f in "$P"/fixtures/*/; do
  timeout 60 "$P/bin/mxserve" verify-fixture "$f" --backend cuda --max-rel-l2 2e-2 >> "$OUT/verify.log" 2>&1 || RC_VER=$?
done
timeout 120 "$P/bin/test_cuda_engine" --gtest_color=no > "$OUT/engine_tests.log" 2>&1
RC_ENG=$?
# Synthetic weights (CUDA bits == CPU bits), the MXFP4 MoE kernels (every variant vs the CPU reference) and
# MXFP4 experts through the loader and the backend's tuned-table selection.
# test_cuda_attention_mixed: mixed batches (decode rows + a prefill chunk), split / shared / warp paths vs the CPU.
RC_MORE=0
for t in test_cuda_synthetic test_cuda_moe_mxfp4 test_cuda_mxfp4_moe test_cuda_attention_mixed; do
  timeout 150 "$P/bin/$t" --gtest_color=no > "$OUT/$t.log" 2>&1 || RC_MORE=$?
done
# The engine end to end on the GPU: the embedded default (synthetic) and a truncated GLM-4.5-Air
# (synthetic, 2 layers: one dense, one MoE) with and without MTP speculation at simulated acceptance.
{
  timeout 60 "$P/bin/mxserve" generate --config "$P/configs/tiny.json" --synthetic-weights --backend cuda \
    --ids 9707,11,1879 --max-tokens 64 --ignore-eos
  for spec in "" "--speculative-algorithm mtp --speculative-num-steps 1 --speculative-simulate-acceptance 2" \
              "--speculative-algorithm mtp --speculative-num-steps 3 --speculative-simulate-acceptance 3"; do
    timeout 120 "$P/bin/mxserve" generate --config "$P/configs/air.json" --synthetic-weights --num-layers 2 \
      --backend cuda --ids 9707,11,1879 --max-tokens 256 --ignore-eos $spec
  done
} > "$OUT/engine_e2e.log" 2>&1
RC_E2E=$?
RC_SAN=skipped
if [ $SANITIZE = 1 ] && command -v compute-sanitizer > /dev/null; then
  timeout 90 compute-sanitizer --tool memcheck --print-limit 20 "$P/bin/test_cuda_ops" --gtest_color=no \
    --gtest_filter='*Moe*:*Attention*:*Router*:*KvWrite*:*Rms*' > "$OUT/sanitizer.log" 2>&1
  RC_SAN=$?
fi
RC_BENCH=skipped
if [ $BENCH = 1 ]; then
  timeout 150 "$P/bin/bench_cuda_kernels" --md "$OUT/bench.md" > "$OUT/bench.log" 2>&1
  RC_BENCH=$?
fi

{
  echo "==== summary ===="
  echo "op tests rc=$RC_OPS   fixture tests rc=$RC_FIX   verify-fixture rc=$RC_VER   engine tests rc=$RC_ENG   synthetic/mxfp4 tests rc=$RC_MORE   engine e2e rc=$RC_E2E   sanitizer rc=$RC_SAN   bench rc=$RC_BENCH"
  grep -E "^\[  (     OK|FAILED |SKIPPED) \]|Failure|rel_l2 [0-9]|Expected|Which is|actual" "$OUT/op_tests.log" | head -60
  grep -E "^\[  FAILED|flips|step .*cuda|Failure" "$OUT/fixture_tests.log" | head -30
  cat "$OUT/verify.log"
  grep -E "^\[  (     OK|FAILED ) \]|requests differ|note:" "$OUT/engine_tests.log" | head -20
  for t in test_cuda_synthetic test_cuda_moe_mxfp4 test_cuda_mxfp4_moe; do
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED \]|Failure" "$OUT/$t.log" | sed "s/^/$t: /" | head -8
  done
  grep -E "generated|error|speculative" "$OUT/engine_e2e.log" | head -20
  [ -f "$OUT/sanitizer.log" ] && grep -E "ERROR SUMMARY|Invalid|out of bounds" "$OUT/sanitizer.log" | head -10
  [ -f "$OUT/bench.log" ] && tail -30 "$OUT/bench.log"
} 2>&1 | tee "$OUT/summary.txt"
