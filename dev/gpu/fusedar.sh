#!/bin/bash
# Issue 32 item 2's last parts on ONE GPU (the shared-device stand-in), standalone from a payload folder
# (dev/make_gpu_payload.sh), one line per check, exit 0 only when every check passed:
#  1. test_cuda_parallel_layouts --gtest_filter '*FusedAllReduceMatchesItsUnfusedRun*:*CudaGraphsAtTpAboveOne*':
#     the fused all-reduce (event-ordered on the stand-in, the default) vs each layout's own unfused run at tp 2 / 4
#     and tp 2 x dp 2 + DP attention; CUDA graphs at tp 2 / 4 (MXSERVE_TP_GRAPHS=1) fused and unfused, tokens equal
#     to eager with steps replayed; a hang fails with "FAIL: timeout" instead of hanging;
#  2. the rest of test_cuda_parallel_layouts (every layout now runs the fused path by default);
#  3. test_cuda_shared_device_comm and test_cuda_peer_allreduce (the collectives and the peer kernels, unchanged);
#  4. informational: parallel7.sh c (the decode-step split: tp 1, tp 2 unfused, tp 2 fused, each collective's cost).
# Usage: fusedar.sh [1|2|3|4|all]
set -u
PART=${1:-all}
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"
unset MXSERVE_COMMUNICATOR MXSERVE_FUSED_ALLREDUCE CUDA_DEVICE_MAX_CONNECTIONS
RC=0
gtest() {  # NAME TIMEOUT [FILTER] [TAG]
  local t=$1 log="$OUT/$1${4:+_$4}.log"
  if [ ! -x "$P/bin/$t" ]; then echo "FAIL $t: not in this payload"; RC=1; return; fi
  timeout "$2" "$P/bin/$t" --gtest_color=no ${3:+--gtest_filter=$3} > "$log" 2>&1; local rc=$?
  if [ $rc = 0 ]; then echo "PASS $t ${3:-}"; else echo "FAIL $t ${3:-}: rc=$rc"; RC=1; fi
  grep -E "^\[  (FAILED|  PASSED|  SKIPPED) \]|^\[       OK \]|^PASS-|Failure|FAIL: timeout" "$log" | head -60
}
case $PART in 1|all) gtest test_cuda_parallel_layouts 580 '*FusedAllReduceMatchesItsUnfusedRun*:*CudaGraphsAtTpAboveOne*' new ;; esac
case $PART in 2|all) gtest test_cuda_parallel_layouts 580 '-*FusedAllReduceMatchesItsUnfusedRun*:*CudaGraphsAtTpAboveOne*' rest ;; esac
case $PART in 3|all) gtest test_cuda_shared_device_comm 200; gtest test_cuda_peer_allreduce 200 ;; esac
case $PART in 4) bash "$P/gpu/parallel7.sh" c ;; esac
exit $RC
