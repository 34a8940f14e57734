#!/bin/bash
# CUDA graphs under data parallelism on ONE GPU (the shared-device stand-in; docs/parallel.md "CUDA graphs under
# DP"), standalone from a payload folder (dev/make_gpu_payload.sh), one line per check, exit 0 only when every
# check passed:
#  1. test_cuda_parallel_layouts --gtest_filter '*CudaGraphsUnderDpMatchEager*:*CudaGraphsAtTpAboveOne*': plain
#     dp 2, dp 2 + DP attention, tp 2 x dp 2 + DP attention (+ EP 4) on glm4_moe_tiny_a and glm_moe_dsa_tiny_a,
#     requests on both DP groups, greedy tokens identical with graphs on and off, decode steps (and with DP
#     attention MTP chain / tree verify steps) replayed, MXSERVE_TP_GRAPHS=0 replaying nothing; and the tp 2 / 4
#     graphs (dp 1) unchanged;
#  2. the seed layout (tp 4 x dp 2 + DP attention + EP 8, MTP, FP8 KV) through `generate --batch 4` on both
#     fixtures: the DP graphs captured (their log line) and greedy tokens identical to --disable-cuda-graph.
# Usage: dpgraphs.sh [1|2|all]
set -u
PART=${1:-all}
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
[ -d "$P/bin" ] || tar -xJf "$P/bin.tar.xz" -C "$P"
[ -d "$P/lib" ] || { mkdir -p "$P/lib" && tar -xJf "$P/libs.tar.xz" -C "$P/lib"; }
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"
unset MXSERVE_COMMUNICATOR MXSERVE_FUSED_ALLREDUCE MXSERVE_TP_GRAPHS CUDA_DEVICE_MAX_CONNECTIONS
RC=0
MX="$P/bin/mxserve"
case $PART in 1|all)
  t=test_cuda_parallel_layouts log="$OUT/dpgraphs_gtest.log"
  if [ -x "$P/bin/$t" ]; then
    timeout 580 "$P/bin/$t" --gtest_color=no --gtest_filter='*CudaGraphsUnderDpMatchEager*:*CudaGraphsAtTpAboveOne*' \
      > "$log" 2>&1; rc=$?
    if [ $rc = 0 ]; then echo "PASS $t DP graphs"; else echo "FAIL $t DP graphs: rc=$rc"; RC=1; fi
    grep -E "^\[  (FAILED|  PASSED|  SKIPPED) \]|^\[       OK \]|^PASS-|Failure|FAIL: timeout" "$log" | head -60
  else
    echo "FAIL $t: not in this payload"; RC=1
  fi
;; esac
case $PART in 2|all)
  SEED="--tp-size 4 --dp-size 2 --enable-dp-attention --ep-size 8 --speculative-algorithm mtp --kv-cache-dtype fp8_e4m3 --speculative-skip-self-test"
  for f in glm4_moe_tiny_a glm_moe_dsa_tiny_a; do
    g="$OUT/dpgraphs_seed_$f"
    for mode in graphs eager; do
      extra=""; [ $mode = eager ] && extra="--disable-cuda-graph"
      timeout 240 "$MX" generate --model "$P/fixtures/$f" --ids 1,2,3 --batch 4 --max-tokens 16 --ignore-eos \
        --backend cuda --communicator shared-device $SEED $extra > "$g.$mode.out" 2> "$g.$mode.err"
      echo $? > "$g.$mode.rc"
    done
    if [ "$(cat "$g.graphs.rc")" = 0 ] && [ "$(cat "$g.eager.rc")" = 0 ] && [ -s "$g.graphs.out" ] && \
       cmp -s "$g.graphs.out" "$g.eager.out" && grep -q "DP groups, each padded to the bucket" "$g.graphs.err"; then
      echo "PASS seed layout $f: DP graphs captured, tokens identical to --disable-cuda-graph"
    else
      echo "FAIL seed layout $f: rc graphs $(cat "$g.graphs.rc") eager $(cat "$g.eager.rc")"
      diff "$g.graphs.out" "$g.eager.out" | head -4; grep -E "CUDA graphs|rror" "$g.graphs.err" | head -6; RC=1
    fi
  done
;; esac
exit $RC
