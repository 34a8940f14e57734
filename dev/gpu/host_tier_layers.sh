#!/bin/bash
# Issue 34 item 3: the host KV tier's per-layer loads on CUDA (copy stream, one event per cached layer, the
# forward's layer l waiting for layer l's copies only). test_cuda_kv_host_tier: the round trip bit-identical
# (target logits, MTP logits, acceptance) on both architectures at block 16 / 4 and a 24-block prompt, and one
# benchmark line per fixture: TTFT of a new turn over a long context from the device pool vs the host tier
# (per-layer loads, then loads ordered before the forward) vs computed whole.
# Run as a stage of dev/gpu/run_all.sh (it sets LD_LIBRARY_PATH and MXSERVE_FIXTURE_ROOT):
#   dev/gpu/run_all.sh PAYLOAD host_tier_layers:240
# Pass: rc=0, every "identical" line, no "MISMATCH", 4 OK lines; the bench lines are the measurement.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
export MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
timeout 220 "$P/bin/test_cuda_kv_host_tier" --gtest_color=no > "$OUT/kv_host_tier_layers.log" 2>&1
echo "test_cuda_kv_host_tier rc=$?"
grep -E "identical|MISMATCH|host KV tier bench|OK \]|FAILED|SKIPPED" "$OUT/kv_host_tier_layers.log" | cut -c1-400 | head -24
