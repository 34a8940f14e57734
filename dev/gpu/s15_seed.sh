#!/bin/bash
# Session 15, issue 32: the seed layout at --gpu-memory-utilization 0.9 (s12.sh part 2: GLM-5.2 8 layers, MXFP4,
# TP4 x DP2 + DP attention + MTP + FP8 KV on eight stand-in ranks, bench shared-prefix at 8 concurrent streams;
# PASS = 16 / 16) with session 15's shared-device allocator retries and the serving steps' check against the dry
# run's activation reserve; then the lines that say which steps went over a rank's reserve and which retries fit.
set -u
. "$(dirname "$0")/payload_env.sh"
bash "$(dirname "$0")/s12.sh" 2
L="$OUT/seed/seed_serve.log"
echo "-- steps over a rank's reserve (activation_watch):"; grep -c "MiB of activations, above" "$L"
grep "MiB of activations, above" "$L" | cut -c1-520 | head -6
echo "-- allocator retries:"; grep -E "fit on retry|did not fit" "$L" | cut -c1-240 | head -6
echo "-- failures:"; grep -E "forward failed" "$L" | cut -c1-700 | head -3
