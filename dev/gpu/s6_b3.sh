#!/bin/bash
# Session 6 closing call 3: the one-GPU stand-in at tp 2 / 4 with the decision hook reaching every rank
# (standin.sh), then the agentic trace replay on whole GLM-4.5-Air with the host KV tier off and on (trace.sh;
# the pool sized for an 80 GB card, the host tier 2x the pool).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
t "host KV tier round trip on CUDA (both architectures)"
[ -x "$P/bin/test_cuda_kv_host_tier" ] && timeout 120 "$P/bin/test_cuda_kv_host_tier" --gtest_color=no > "$OUT/kv_host_tier.log" 2>&1
echo "test_cuda_kv_host_tier rc=$?"; grep -E "identical|differ|OK \]|FAILED" "$OUT/kv_host_tier.log" | cut -c1-200 | head -12
t "stand-in"
OUT=$OUT/standin timeout 120 bash "$P/gpu/standin.sh" 2>&1 | grep -E "PASS|FAIL|rc=" | head -30
t "trace replay"
POOL=${POOL:-6GiB} HOST_TIER_FLAGS=${HOST_TIER_FLAGS:---kv-cache-host-memory 12GiB} TRACE_SESSIONS=${TRACE_SESSIONS:-10} \
  TRACE_TURNS=${TRACE_TURNS:-4} TRACE_C=${TRACE_C:-5} OUT=$OUT/trace timeout 380 bash "$P/gpu/trace.sh"
t done
