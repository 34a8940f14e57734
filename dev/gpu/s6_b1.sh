#!/bin/bash
# Session 6 closing call 1 (from a payload in a copied checkout): every GPU test after the merges --
# phase 1: the model-level tests side by side (decision-aware fixtures, speculation on the trained model with the
#   extend-vs-decode sweep, engine, graphs, the host KV tier's round trip, the shared-device communicator);
# phase 2: every op test (ops6.sh: kernel retirements, one wgmma header, the wg/wg8 tile walker, one harness);
# phase 3: the one-GPU stand-in at tp 2 / 4 (standin.sh); `mxserve --version`.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd)
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
t "phase 1"
: > "$OUT/rc1.txt"
for tst in test_cuda_fixture test_cuda_spec_trained test_cuda_engine test_cuda_graphs test_cuda_kv_host_tier \
           test_cuda_shared_device_comm; do
  ( [ -x "$B/$tst" ] || { echo "$tst: not in payload" >> "$OUT/rc1.txt"; exit 0; }
    timeout 200 "$B/$tst" --gtest_color=no > "$OUT/m_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/rc1.txt" ) &
done
wait
sort "$OUT/rc1.txt"
for f in "$OUT"/m_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK \]' $f) ok"; grep "^\[  FAILED  \]" "$f" | head -4; done
grep -hE "^c=|^(chain4|tree3x4x8):" "$OUT/m_test_cuda_spec_trained.log" | cut -c1-200
grep -hE "identical|cached_host" "$OUT/m_test_cuda_kv_host_tier.log" | head -8 | cut -c1-200
t "phase 2: ops"
OUT=$OUT/ops bash "$P/gpu/ops6.sh"
t "phase 3: stand-in"
OUT=$OUT/standin timeout 150 bash "$P/gpu/standin.sh" 2>&1 | grep -E "PASS|FAIL|rc=" | head -30
"$B/mxserve" --version
t done
