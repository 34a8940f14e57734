#!/bin/bash
# Issue 32, CUDA graphs at tp > 1 (one GPU; standalone from a payload folder, like s8_d1.sh). Payload:
#   MXSERVE_PAYLOAD_ONLY="mxserve test_cuda_rank_graphs test_cuda_graphs test_cuda_parallel_layouts" \
#     dev/make_gpu_payload.sh build PAYLOAD; then on the GPU machine: bash PAYLOAD/gpu/rank_graphs.sh
#  1. test_cuda_rank_graphs: per-rank graphs (launch/rank_graphs.h) over a one-rank NCCL world forced per rank,
#     rank 0 in place and reading copies, both *_tiny_a fixtures: tokens identical to eager, every replay a
#     per-rank one; recovery refused once a per-rank graph exists; two stand-in ranks forced per rank refused;
#  2. test_cuda_graphs and test_cuda_parallel_layouts' CudaGraphsAtTpAboveOneMatchEager: the capture / replay hooks
#     (CausalLM::capture_device_graph / replay_device_graph) change nothing at tp 1 nor for the joined capture;
#  3. verify-fixture at tp 2 / 4 on the stand-in now checks graphs on vs off (with MTP: verify steps replayed).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
export MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
unset MXSERVE_COMMUNICATOR
RC=0
g() { local n=$1 to=$2; shift 2; timeout $to "$B/$n" --gtest_color=no "$@" > "$OUT/t_$n.log" 2>&1; local rc=$?
      echo "== $n rc=$rc"; grep -E "^\[  (FAILED|  PASSED|  SKIPPED) \]|Failure|^PASS-|CHECK failed" "$OUT/t_$n.log" | head -20
      [ $rc = 0 ] || RC=$rc; }
g test_cuda_rank_graphs 300
g test_cuda_graphs 200
g test_cuda_parallel_layouts 400 --gtest_filter='*CudaGraphsAtTpAboveOneMatchEager*'
for f in glm4_moe_tiny_a glm_moe_dsa_tiny_a; do
  for tp in 2 4; do
    log="$OUT/rank_graphs_vf_${f}_tp$tp.log"
    timeout 360 "$B/mxserve" verify-fixture "$P/fixtures/$f" --backend cuda --tp-size $tp --communicator shared-device \
      --max-rel-l2 2e-2 > "$log" 2>&1; rc=$?
    if [ $rc = 0 ] && grep -q "cuda graphs: .*PASS" "$log" && ! grep -q "not checked" "$log"; then
      echo "PASS verify-fixture $f --tp-size $tp graphs checked: $(grep -E '^cuda graphs' "$log" | cut -c1-160 | tr '\n' ' ')"
    else
      echo "FAIL verify-fixture $f --tp-size $tp: rc=$rc"; grep -E "cuda graphs|failed checks|rror|FAIL" "$log" | head -8; RC=1
    fi
  done
done
exit $RC
