#!/bin/bash
# Session 7: every GPU test of the tree as it is (the model-level tests side by side, then every op test through
# ops6.sh, then the one-GPU stand-in), for issue 31's "GPU suite passes" on the card the call got.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd)
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
: > "$OUT/rc1.txt"
for tst in test_cuda_fixture test_cuda_engine test_cuda_graphs test_cuda_kv_host_tier test_cuda_shared_device_comm; do
  ( [ -x "$B/$tst" ] || { echo "$tst: not in payload" >> "$OUT/rc1.txt"; exit 0; }
    timeout 200 "$B/$tst" --gtest_color=no > "$OUT/m_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/rc1.txt" ) &
done
wait
sort "$OUT/rc1.txt"
for f in "$OUT"/m_*.log; do echo "== $(basename $f .log): $(grep -c '^\[       OK \]' $f) ok"; grep "^\[  FAILED  \]" "$f" | head -4; done
t "ops"
OUT=$OUT/ops bash "$P/gpu/ops6.sh" 2>&1 | tail -30
t "stand-in"
OUT=$OUT/standin timeout 150 bash "$P/gpu/standin.sh" 2>&1 | grep -E "PASS|FAIL|rc=" | head -30
"$B/mxserve" --version
t done
