#!/bin/bash
# Session 8 (seedmem): the seed layout made robust and small enough, on ONE GPU. One line per check, PASS or FAIL.
#  1. test_engine_oom_cuda: the CUDA caching allocator's cudaMalloc fails (test hook, both tries) in a request's
#     first step: that request fails with out_of_memory naming the allocation, the next request decodes the tokens
#     of an engine that never failed (the engine keeps serving; no abort);
#  2. test_cuda_mxfp4_slices: synthetic MXFP4 experts kept packed per rank slice (tp 2, tp 4, tp 2 x dp 2 + DP
#     attention on the shared-device stand-in) decode the one-rank tokens, every rank holds less device memory
#     than the one-rank model; the start-up KV budget (dry run) measures a peak, checks / sizes the KV pool, and
#     refuses a --kv-cache-memory the GPU cannot hold;
#  3. the seed layout (dev/gpu/s7_seed.sh: GLM-5.2, 8 layers, MXFP4, TP4 x DP2 + DP attention + MTP + FP8 KV, 8
#     ranks on the GPU, KV sized by --gpu-memory-utilization) serves `mxserve bench` shared-prefix at 8 streams
#     with 100% success and the server alive afterwards.
# Usage (from a payload): dev/gpu/run_all.sh PAYLOAD seedmem:590   (SEED_* env vars as in s7_seed.sh)
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
export MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
RC=0
check() { local name=$1; shift; if "$@" > "$OUT/seedmem_$name.log" 2>&1; then echo "PASS $name"; else echo "FAIL $name (rc $?; $OUT/seedmem_$name.log)"; tail -5 "$OUT/seedmem_$name.log"; RC=1; fi; }
check engine_oom_cuda timeout 300 "$P/bin/test_engine_oom_cuda"
check cuda_mxfp4_slices timeout 300 "$P/bin/test_cuda_mxfp4_slices"
SEED_DIR=$(cd "$(dirname "$0")" && pwd)
bash "$SEED_DIR/s7_seed.sh" | tee "$OUT/seedmem_seed.txt"
if grep -q "Success rate.*100" "$OUT/seedmem_seed.txt" && grep -q "seed server alive" "$OUT/seedmem_seed.txt"; then
  echo "PASS seed_layout"; else echo "FAIL seed_layout ($OUT/seed_serve.log)"; RC=1; fi
exit $RC
