#!/bin/bash
# The GPU tests of issue 19 on ONE GPU (stage "nccl" of run_all.sh, or standalone from a payload folder):
#  1. test_cuda_peer_allreduce: the fused peer all-reduce + add + RMSNorm, N = 1, 2, 4, 8 ranks standing in on
#     one device, one-shot / two-shot / NCCL fallback vs the CPU reference (PASS/FAIL line per case);
#  2. test_cuda_nccl: the one-rank NCCL communicator (identity semantics, errors, abort) and the glm4_moe
#     fixtures' logits identical with and without it;
#  3. the GPU suite's launch-based parts with MXSERVE_COMMUNICATOR=nccl (the one-rank CUDA launch runs every
#     collective through NCCL): verify-fixture on the glm4_moe fixtures, test_cuda_engine, test_cuda_graphs;
#  4. --tp-size 2 --backend cuda on one GPU is refused naming the flag and the GPU count;
#  5. bench_peer_allreduce (ONE-GPU STAND-IN numbers: peers on one device, not NVLink).
# NCCL comes from the image's pip wheel (nvidia-nccl-cu13) when the loader does not find libnccl.so.2.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
[ -d "$P/bin" ] || tar -xJf "$P/bin.tar.xz" -C "$P"
[ -d "$P/lib" ] || { mkdir -p "$P/lib" && tar -xJf "$P/libs.tar.xz" -C "$P/lib"; }
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
NCCL_PIP=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${NCCL_PIP}:${LD_LIBRARY_PATH:-}"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast (KINDS.md)
echo "NCCL from: ${NCCL_PIP:-the loader path} ($(ls "${NCCL_PIP:-/nonexistent}"/libnccl.so* 2>/dev/null | head -1))"
RC=0
gtest() {  # NAME SECONDS [env...]
  local t=$1 secs=$2; shift 2
  [ -x "$P/bin/$t" ] || { echo "FAIL $t: not in this payload"; RC=1; return; }
  local log="$OUT/$t${1:+_nccl}.log"
  env "$@" timeout "$secs" "$P/bin/$t" --gtest_color=no > "$log" 2>&1; local rc=$?
  echo "== $t $* rc=$rc"
  grep -E "^(PASS|FAIL)|^\[  (FAILED|  PASSED|  SKIPPED) \]|Failure|NCCL [0-9]|fused all-reduce" "$log" | head -60
  [ $rc = 0 ] || RC=$rc
}
gtest test_cuda_peer_allreduce 240
gtest test_cuda_nccl 180
gtest test_cuda_engine 150 MXSERVE_COMMUNICATOR=nccl
gtest test_cuda_graphs 150 MXSERVE_COMMUNICATOR=nccl
for f in glm4_moe_tiny_a glm4_moe_tiny_b; do
  MXSERVE_COMMUNICATOR=nccl timeout 90 "$P/bin/mxserve" verify-fixture "$P/fixtures/$f" --backend cuda --max-rel-l2 2e-2 \
    > "$OUT/verify_nccl_$f.log" 2>&1; rc=$?
  echo "== verify-fixture $f --backend cuda with MXSERVE_COMMUNICATOR=nccl rc=$rc"
  grep -E "failed checks|NCCL|one-rank|Error|error" "$OUT/verify_nccl_$f.log" | head -8
  [ $rc = 0 ] && echo "PASS verify-fixture $f through NCCL" || { echo "FAIL verify-fixture $f through NCCL"; RC=1; }
done
timeout 60 "$P/bin/mxserve" generate --model "$P/fixtures/glm4_moe_tiny_b" --ids 1,2 --tp-size 2 --backend cuda \
  > "$OUT/tp2_one_gpu.log" 2>&1; rc=$?
if [ $rc = 2 ] && grep -q "2 ranks need one GPU each (devices 0..1), but 1 GPU(s) are visible" "$OUT/tp2_one_gpu.log"; then
  echo "PASS --tp-size 2 on one GPU refused: $(grep -o '2 ranks need.*visible[^)]*)' "$OUT/tp2_one_gpu.log" | head -1)"
else
  echo "FAIL --tp-size 2 on one GPU: rc=$rc"; tail -3 "$OUT/tp2_one_gpu.log"; RC=1
fi
[ -x "$P/bin/bench_peer_allreduce" ] && timeout 120 "$P/bin/bench_peer_allreduce" 4096 200 2>&1 | tee "$OUT/bench_peer_allreduce.log" | tail -40
exit $RC
