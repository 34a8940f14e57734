#!/bin/bash
# Issue 36 item 1 (second half): CUDA graphs of chain MTP verify steps and MTP draft-chain continuation steps.
# 1. test_cuda_graphs: graphs on / off with MTP on all four fixtures (+ glm_moe_dsa_tiny_a with
#    index_share_for_mtp_iteration): identical tokens AND accepted-draft counts, verify and MTP replays > 0.
# 2. verify-fixture --backend cuda on the four fixtures: the "cuda graphs + MTP" line must PASS with
#    verify and MTP steps replayed.
# 3. GLM-4.5-Air and GLM-5.2 (8 layers, synthetic MXFP4) decode with MTP N = 3 at a simulated acceptance of
#    2.5, graphs off vs on (same binary, same run): decode tok/s of the RESULT lines, capture counts / times.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
export MXSERVE_REPO_ROOT=$(cd "$P/.." && pwd)
export MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
timeout 300 "$B/test_cuda_graphs" --gtest_color=no > "$OUT/t_graphs_mtp.log" 2>&1; echo "test_cuda_graphs rc=$?"
grep -E "^\[  FAILED|^\[       OK|^\[  SKIPPED|replays|Failure|Expected|Which is" "$OUT/t_graphs_mtp.log" | cut -c1-240 | head -60
for fx in glm_moe_dsa_tiny_a glm_moe_dsa_tiny_b glm4_moe_tiny_a glm4_moe_tiny_b; do
  timeout 120 "$B/mxserve" verify-fixture "$P/fixtures/$fx" --backend cuda --max-rel-l2 2e-2 > "$OUT/vf_mtp_$fx.log" 2>&1
  echo "verify-fixture $fx rc=$?"; grep -E "cuda graphs|accepted|failed checks" "$OUT/vf_mtp_$fx.log" | cut -c1-260
done
t "MTP decode, graphs off vs on"
for cfg in air glm52; do
  for mode in eager graph; do
    F=(--disable-cuda-graph); [ $mode = graph ] && F=(--cuda-graph)
    timeout 150 "$B/mxserve" generate --config "$P/configs/$cfg.json" --synthetic-weights --quantization mxfp4 \
      --num-layers 8 --backend cuda --prompt-len 512 --max-tokens 256 --ignore-eos --runs "b=1,n=3,a=2.5;b=8,n=3,a=2.5" \
      --speculative-algorithm mtp --speculative-num-steps 3 --no-speculative-adaptive \
      --speculative-skip-self-test "${F[@]}" > "$OUT/mtp_${cfg}_$mode.log" 2>&1
    echo "$cfg $mode rc=$?"; grep -E "RESULT|captured|run eagerly|eager" "$OUT/mtp_${cfg}_$mode.log" | cut -c1-300 | tail -8
  done
done
t done
