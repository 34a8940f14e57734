#!/bin/bash
# Session 9 dpmem (issue 32's two robustness gaps): (1) the stand-in rank group recovering from one rank's device
# OOM (test_cuda_lockstep_recovery), with the OOM / allocator / stand-in tests it touches; (2) the seed layout
# (GLM-5.2, 8 layers, MXFP4, TP4 x DP2 + DP attention + MTP + FP8 KV on the shared-device stand-in) sized by the
# DEFAULT --gpu-memory-utilization 0.9 (s7_seed.sh without SEED_KV), expected: 100% success, the server alive, the
# start-up log's activation-reserve line, and any "released ... cached by the other allocators" warning.
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd) MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
: > "$OUT/rc.txt"
g() { local n=$1 to=$2; shift 2; timeout $to "$B/$n" --gtest_color=no "$@" > "$OUT/t_$n.log" 2>&1; echo "$n rc=$?" >> "$OUT/rc.txt"; }
g test_cuda_lockstep_recovery 200
g test_engine_oom_cuda 150
g test_cuda_shared_device_comm 100
g test_cuda_mxfp4_slices 200
g test_cuda_parallel_layouts 300 '--gtest_filter=*EngineGreedyTokensEqualOneRank*:*MtpChainAndTreeWithSeveralRanks*'
sort "$OUT/rc.txt"; t "tests done"
for f in "$OUT"/t_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK' $f) ok"; grep -E "^\[  FAILED|Failure|recovered|released" "$f" | cut -c1-220 | head -8; done
t "seed layout, 8 layers MXFP4, default --gpu-memory-utilization 0.9"
unset SEED_KV; SEED_UTIL=0.9 OUT=$OUT/seed timeout 300 bash "$P/gpu/s7_seed.sh"
grep -E "start-up dry run|device memory, GPU|KV cache budget|released|recovered|out of memory" "$OUT/seed/seed_serve.log" | cut -c1-400 | head -12
t done
